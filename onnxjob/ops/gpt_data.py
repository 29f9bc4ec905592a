"""`flow.data.megatron_gpt_mmap_data_loader` (MegatronGPTMMapDataLoader): batches of
token samples from a Megatron-LM indexed dataset (io/megatron.py), read on the host."""
import numpy as np

from onnxjob import dtypes
from onnxjob.errors import TraceError
from onnxjob.graph.tracer import current_builder
from onnxjob.io import megatron
from onnxjob.ops.random import gen_seed
from onnxjob.runtime.pipeline import HostNode


def megatron_gpt_mmap_data_loader(data_file_prefix, seq_length, num_samples, batch_size,
                                  dtype=dtypes.int64, shuffle=True, random_seed=None,
                                  split_sizes=None, split_index=None, nd_sbp=None,
                                  start_from_saved_progress=False, name=None,
                                  parallel_distribution=None):
    """A (batch_size, seq_length + 1) blob of `dtype` per run: the next samples of the
    dataset `data_file_prefix`.idx/.bin, laid out for `num_samples` samples of split
    `split_index` of `split_sizes` (weights, default one split), shuffled with
    `random_seed` (default: from the job's seed stream). Running past the samples laid out
    raises, as OneFlow's reader does. `nd_sbp` (OneFlow 0.4: `parallel_distribution`)
    places OneFlow's reader; onnxjob reads the whole batch in one process."""
    api = "flow.data.megatron_gpt_mmap_data_loader"
    if start_from_saved_progress:
        raise TraceError(f"{api}: start_from_saved_progress keeps the reader's position in a "
                         "checkpointed variable, which onnxjob's host-side reader does not "
                         "have; pass start_from_saved_progress=False")
    split_sizes = list(split_sizes) if split_sizes is not None else [1]
    split_index = 0 if split_index is None else int(split_index)
    if not 0 <= split_index < len(split_sizes):
        raise ValueError(f"split index {split_index} is out of range, split_sizes "
                         f"{split_sizes}")
    builder = current_builder(api)
    seed = gen_seed(random_seed)[0] % 2 ** 32
    try:
        dataset = megatron.GPTDataset(data_file_prefix, seq_length, num_samples, split_sizes,
                                      split_index, shuffle, seed)
    except megatron.MegatronError as e:
        raise TraceError(f"{api}: {e}") from None
    np_dtype = dtypes.to_numpy(dtype)
    batch = int(batch_size)
    position = [0]

    def next_batch():
        start = position[0]
        position[0] += batch
        return np.stack([dataset.sample(start + i) for i in range(batch)]).astype(np_dtype)

    node_name = builder.unique_name(name or "gpt_data_loader")
    return builder.add_source(node_name, (batch, int(seq_length) + 1), np_dtype,
                              HostNode(node_name, next_batch))


MegatronGPTMMapDataLoader = megatron_gpt_mmap_data_loader

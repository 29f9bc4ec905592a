"""How a data-parallel step's values travel between onnxruntime and the collectives
(runtime/staged.py runs part A's stages, runtime/data_parallel.py the step).

HostPath, on the CPU: the values the collectives read become NumPy arrays (views of
onnxruntime's CPU buffers) and the collectives are runtime/distributed.py's, on gloo.

DevicePath, on CUDA: nothing goes through the host. The stages and the update run with
IOBinding, their outputs bound to the rank's GPU; an output becomes a torch tensor by
DLPack (`torch.from_dlpack(ort_value)`: the same memory), the collectives are
runtime/tensor_collectives.py's on those tensors (NCCL), and their results go back to
onnxruntime as OrtValues by DLPack (`OrtValue.from_dlpack(tensor)`: the same memory).
Where onnxruntime's CUDA EP is not in use it runs on the CPU with the same code (CPU
OrtValues and CPU torch tensors, gloo) only when DLPACK_ON_CPU is set: the tests' proof
that this path computes what HostPath does (tests/test_dlpack_path.py).

Streams. onnxruntime's OrtValue.__dlpack__ ignores the consumer's stream ("currently
unused", onnxruntime 1.32), so the hand-over is ordered on the host instead:
onnxruntime's run returns once its stream has finished (it synchronizes its execution
providers at the end of a run, the default), so torch may read its outputs on any stream;
and before each onnxruntime run, torch's current stream is synchronized, so that what torch
made (a collective's result, the grads after the all-reduce's wait) is there, and so that
torch has finished reading onnxruntime's outputs before onnxruntime reuses their memory.
An all-reduce started with async_op=True is not waited for by that synchronization (NCCL
runs on its own stream): it overlaps the later stages, as intended.
"""
import functools

import numpy as np
import onnxruntime as ort

from onnxjob.runtime import distributed, tensor_collectives

# internal switch for tests (no public setting): run DevicePath on the CPU
DLPACK_ON_CPU = False


def for_device(device, device_id=0):
    """The path of a data-parallel step on `device` ("cpu" or "cuda", GPU `device_id`)."""
    if device == "cuda":
        return DevicePath("cuda", device_id)
    if device != "cpu":
        raise ValueError(f"a data-parallel step runs on 'cpu' or 'cuda', got {device!r}")
    return DevicePath("cpu", 0) if DLPACK_ON_CPU else HostPath()


class HostPath:
    """Values cross as NumPy arrays; collectives on them (runtime/distributed.py)."""
    device_resident = False
    # gloo's collectives take milliseconds here: a stage's other work runs meanwhile
    # (runtime/staged.py; a ResNet50 step over 2 ranks: 5-9% faster, bench_stages.py)
    overlap_collectives = True
    # a stage's collectives by op type: each starts and returns its wait (runtime/staged.py)
    start_collective = {"AllGather": distributed.all_gather_async,
                        "AllReduceMean": functools.partial(distributed.total_async, mean=True),
                        "AllReduceSum": distributed.total_async}
    total_async = staticmethod(distributed.total_async)

    @staticmethod
    def feed(array):
        """An OrtValue of `array` to run a stage on."""
        return ort.OrtValue.ortvalue_from_numpy(np.asarray(array, order="C"))

    @staticmethod
    def run(session, output_names, inputs):
        """`output_names` of `session` for `inputs` {name: OrtValue}, as OrtValues."""
        return session.run_with_ort_values(output_names, inputs)

    @staticmethod
    def export(ort_value):
        """What the collectives and the step read of an output: a NumPy array."""
        return ort_value.numpy()

    ort_value = feed        # a collective's result, to run the next stages on


class DevicePath:
    """Values stay where onnxruntime made them and cross to torch by DLPack, without a
    copy; collectives on torch tensors (runtime/tensor_collectives.py)."""
    device_resident = True
    start_collective = {"AllGather": tensor_collectives.all_gather_async,
                        "AllReduceMean": functools.partial(tensor_collectives.total_async,
                                                           mean=True),
                        "AllReduceSum": tensor_collectives.total_async}
    total_async = staticmethod(tensor_collectives.total_async)

    def __init__(self, device, device_id=0):
        import torch
        self.device, self.device_id = device, device_id
        self._torch = torch
        self._stream_owner = torch.device("cuda", device_id) if device == "cuda" else None

    @property
    def overlap_collectives(self):
        """Whether a stage's other nodes run while its collectives travel
        (runtime/staged.py). Over gloo's CUDA tensors (ranks sharing a GPU; each collective
        goes through the host, milliseconds) yes: ResNet50 at batch 8, 2 ranks on one H200,
        a step 5-6% shorter (bench_stages.py). Over NCCL, one session a stage: a second
        onnxruntime run a stage cost 0.23 ms there (host overhead, a synchronization),
        about what NCCL's small collectives take. NOTE: unmeasured on NCCL (needs 2 GPUs)."""
        return distributed._group["backend"] != "nccl"

    def feed(self, value):
        """An OrtValue on this path's device for an input: an OrtValue as it is (a
        variable on the GPU), a torch tensor by DLPack, a NumPy array copied to the GPU or,
        on the CPU, shared through torch (so that every CPU value of this path is owned by
        onnxruntime or torch, which DLPack keeps alive; an OrtValue over a NumPy array is
        not kept alive by a DLPack consumer)."""
        if isinstance(value, ort.OrtValue):
            return value
        if isinstance(value, self._torch.Tensor):
            return to_ort(value)
        array = np.asarray(value, order="C")
        if self.device == "cuda":
            return ort.OrtValue.ortvalue_from_numpy(array, "cuda", self.device_id)
        if not array.flags.writeable:
            array = array.copy()        # torch shares writable memory only
        return to_ort(self._torch.from_numpy(array))

    def run(self, session, output_names, inputs):
        """`output_names` of `session` for `inputs` {name: OrtValue}, as OrtValues on this
        path's device (IOBinding)."""
        if self._stream_owner is not None:
            self._torch.cuda.current_stream(self._stream_owner).synchronize()
        binding = session.io_binding()
        for name, value in inputs.items():
            binding.bind_ortvalue_input(name, value)
        for name in output_names:
            binding.bind_output(name, self.device, self.device_id)
        session.run_with_iobinding(binding)
        return binding.get_outputs()

    @staticmethod
    def export(ort_value):
        """What the collectives and the step read of an output: a torch tensor, the same
        memory."""
        return to_torch(ort_value)

    def ort_value(self, tensor):
        """A collective's result as an OrtValue, the same memory."""
        return to_ort(tensor)

    def stored(self, value):
        """A variable's new value (a torch tensor or an OrtValue this path made) in the
        session's store: a GPU OrtValue on CUDA, a NumPy array on the CPU."""
        if self.device == "cuda":
            return value if isinstance(value, ort.OrtValue) else to_ort(value)
        return (to_torch(value) if isinstance(value, ort.OrtValue) else value).numpy()

    @staticmethod
    def host(tensor):
        """A step output as a NumPy array (copied from the GPU; shared on the CPU)."""
        return tensor.cpu().numpy()


def to_torch(ort_value):
    """The torch tensor over an OrtValue's memory (DLPack, no copy)."""
    import torch
    return torch.from_dlpack(ort_value)


def to_ort(tensor):
    """The OrtValue over a torch tensor's memory (DLPack, no copy for a contiguous one;
    it keeps the tensor alive)."""
    return ort.OrtValue.from_dlpack(tensor.contiguous())

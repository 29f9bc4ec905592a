"""A data-bound training loop: decoding and augmenting JPEG records (OneFlow-Benchmark's
ImageNet pipeline: random-crop decoding, Resize, CoinFlip, CropMirrorNormalize) costs more
than the train step of a small CNN. Steps per second with the batches prefetched on the
host pipeline's thread (function_config.prefetch(2), the default) and made inline
(prefetch(0)), one process, the two jobs' rounds interleaved.

    python bench/bench_pipeline.py [--batch 32] [--size 256] [--rounds 7] [--calls 20]
                                   [--threads 2] [--decode-threads N]

--threads sets onnxruntime's intra-op threads, --decode-threads the threads that decode a
batch ($ONNXJOB_DECODE_THREADS; default min(4, cores)). The dataset (MNIST digits
upscaled to --size and tinted, JPEG) is written to a temporary folder.
NOTE: while one job's round runs, the other job's prefetch thread may fill its queue
(2 batches), so about 2 calls per round of the prefetched job find their batch ready;
--calls keeps that share small.
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)


def parse():
    from common import add_timing_args
    p = add_timing_args(argparse.ArgumentParser(), rounds=7, calls=20)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--size", type=int, default=256, help="side of the stored JPEGs")
    p.add_argument("--images", type=int, default=256, help="records in the dataset")
    p.add_argument("--decode-threads", type=int, default=0, help="0: onnxjob's default")
    return p.parse_args()


def write_dataset(data_dir, count, size):
    from conftest import MNIST
    from ofrecord_datasets import load_digits, rgb_digits, write_imagenet_like
    digits, labels = load_digits(MNIST, count)
    write_imagenet_like(data_dir, rgb_digits(digits, size), labels, data_part_num=4)


def small_cnn(flow, images):
    """Two strided convolutions and a dense layer: a step lighter than the data."""
    init = flow.truncated_normal(0.1)
    x = flow.layers.conv2d(images, 16, 3, strides=2, padding="SAME", activation=flow.nn.relu,
                           kernel_initializer=init, name="conv1")
    x = flow.layers.conv2d(x, 32, 3, strides=2, padding="SAME", activation=flow.nn.relu,
                           kernel_initializer=init, name="conv2")
    x = flow.nn.avg_pool2d(x, ksize=x.shape[2], strides=1, padding="VALID", name="pool")
    return flow.layers.dense(flow.reshape(x, [x.shape[0], -1]), 10, kernel_initializer=init,
                             name="dense")


def loader(flow, data_dir, batch):
    """OneFlow-Benchmark's load_imagenet_for_training at 64x64: (labels, NCHW images)."""
    records = flow.data.ofrecord_reader(data_dir, batch_size=batch, data_part_num=4,
                                        part_name_suffix_length=5, random_shuffle=True,
                                        shuffle_buffer_size=64, shuffle_after_epoch=True)
    labels = flow.data.OFRecordRawDecoder(records, "class/label", shape=(), dtype=flow.int32)
    decoded = flow.data.OFRecordImageDecoderRandomCrop(records, "encoded", color_space="RGB")
    resized = flow.image.Resize(decoded, target_size=[64, 64])[0]
    images = flow.image.CropMirrorNormalize(
        resized, mirror_blob=flow.random.CoinFlip(batch_size=batch), color_space="RGB",
        mean=[123.68, 116.779, 103.939], std=[58.393, 57.12, 57.375])
    return labels, images


def define_jobs(flow, tp, data_dir, batch):
    """{"prefetch": job, "inline": job} reading the dataset, and a placeholder step."""
    def train(labels, images):
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels,
                                                                small_cnn(flow, images))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.01]),
                           momentum=0.9).minimize(loss)
        return loss

    jobs = {}
    for name, depth in (("prefetch", 2), ("inline", 0)):
        config = flow.function_config()
        config.prefetch(depth)

        def body() -> tp.Numpy:
            return train(*loader(flow, data_dir, batch))

        body.__name__ = f"{name}_job"
        jobs[name] = flow.global_function(type="train", function_config=config)(body)

    @flow.global_function(type="train")
    def step_only(images: tp.Numpy.Placeholder((batch, 3, 64, 64)),
                  labels: tp.Numpy.Placeholder((batch,), dtype=flow.int32)) -> tp.Numpy:
        return train(labels, images)

    config = flow.function_config()
    config.prefetch(0)

    @flow.global_function(function_config=config)
    def data_only() -> tp.Numpy:
        labels, images = loader(flow, data_dir, batch)
        return flow.math.reduce_mean(images) + flow.cast(flow.math.reduce_sum(labels),
                                                         flow.float)

    return jobs, step_only, data_only


def main():
    args = parse()
    os.environ["ONNXJOB_NUM_THREADS"] = str(args.threads)
    if args.decode_threads:
        os.environ["ONNXJOB_DECODE_THREADS"] = str(args.decode_threads)
    import onnxjob as flow
    import onnxjob.typing as tp
    from common import interleaved, time_calls
    from onnxjob.io.images import decode_threads

    with tempfile.TemporaryDirectory() as data_dir:
        write_dataset(data_dir, args.images, args.size)
        jobs, step_only, data_only = define_jobs(flow, tp, data_dir, args.batch)
        images = np.zeros((args.batch, 3, 64, 64), np.float32)
        labels = np.zeros(args.batch, np.int32)
        step_s = min(time_calls(lambda: step_only(images, labels), args.calls)
                     for _ in range(3))
        data_s = min(time_calls(data_only, args.calls) for _ in range(3))
        start = time.perf_counter()
        medians = interleaved(jobs, args.rounds, args.calls)
        elapsed = time.perf_counter() - start
    print(f"batch {args.batch} of {args.size}x{args.size} JPEGs -> random crop, 64x64 resize, "
          f"mirror, normalize; {decode_threads()} decode thread(s), {args.threads} "
          f"onnxruntime thread(s), {os.cpu_count()} cores")
    print(f"train step alone {step_s * 1e3:7.2f} ms   data alone {data_s * 1e3:7.2f} ms   "
          f"({args.rounds} rounds x {args.calls} calls, {elapsed:.1f} s)")
    for name, seconds in medians.items():
        print(f"{name:9s} {seconds * 1e3:7.2f} ms/step  {1 / seconds:7.2f} steps/s")
    print(f"speed-up (inline / prefetch): {medians['inline'] / medians['prefetch']:.2f}x")


if __name__ == "__main__":
    main()

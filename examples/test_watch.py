"""flow.watch in a predict job that returns None: the watchers print after the call returns."""
import numpy as np

import onnxjob as flow
import onnxjob.typing as tp


def watch_input(x: tp.Numpy):
    print("in:", x)


def watch_output(y: tp.Numpy):
    print("out:", y)


@flow.global_function()
def relu_job(x: tp.Numpy.Placeholder((5,))) -> None:
    y = flow.nn.relu(x)
    flow.watch(x, watch_input)
    flow.watch(y, watch_output)


if __name__ == "__main__":
    relu_job(np.random.uniform(-1, 1, 5).astype(np.float32))

"""The MLP of the async examples (784-512-10, truncated-normal(0.1) weights)."""
import onnxjob as flow


def mlp(data):
    init = flow.truncated_normal(0.1)
    flat = flow.reshape(data, [data.shape[0], -1])
    hidden = flow.layers.dense(flat, 512, activation=flow.nn.relu, kernel_initializer=init,
                               name="hidden")
    return flow.layers.dense(hidden, 10, kernel_initializer=init, name="output")

"""One device's accumulating train step with its values kept on the device.

The mirrored step (runtime/mirrored_step.py) reads each part's outputs as NumPy arrays and
adds the gradients on the host; on a GPU that copies every variable to the host and back
and every gradient to the host once per micro-batch. Here, for one device's gradient
accumulation (no mirrored devices, no ranks), part A and part B run with IOBinding: the
variables go in as the session's OrtValues, the gradients and part A's new state come out
on the device, and the gradients are combined there by a small session of their own
(`MeanUpdate`): after micro-batch k the running gradient is the mean weighted by the
loss's element counts, acc_k = acc_(k-1) * T_(k-1) / T_k + g_k * c_k / T_k (T_k the counts
so far), so the last one is what part B takes, sum_k(g_k * c_k) / sum_k(c_k), as on the
host (in the gradients' dtype there, float64 on the host). Only the returned values and
the loss's element count come to the host.
"""
import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from onnxjob.runtime import backend


def applies(device, ranks, elements):
    """Whether a mirrored step of `elements` device list elements over `ranks` ranks runs
    here: one element on one rank, on CUDA (on the CPU the host path has nothing to save;
    tests run this one there too, with CPU OrtValues)."""
    return ranks == 1 and elements == 1 and device == "cuda"


class DeviceRuns:
    """Part A, the gradients' running mean and part B of `step` (a MirroredStep) on
    `device`, each one IOBinding run."""

    def __init__(self, step, device, create_session, grad_types):
        self._step, self._device = step, device
        self._device_id = backend.cuda_device_id() if device == "cuda" else 0
        self._mean = MeanUpdate(create_session, grad_types)

    def _run(self, session, inputs, on_device, on_host):
        binding = session.io_binding()
        for name, value in inputs.items():
            if isinstance(value, ort.OrtValue):
                binding.bind_ortvalue_input(name, value)
            else:
                binding.bind_cpu_input(name, np.ascontiguousarray(value))
        for name in on_device:
            binding.bind_output(name, self._device, self._device_id)
        for name in on_host:
            binding.bind_output(name, "cpu")
        session.run_with_iobinding(binding)
        return binding.get_outputs()

    def _inputs(self, names, feeds, extra=None):
        step = self._step
        return step._feeds(names, feeds, extra, stored=lambda value: value)

    def forward_backward(self, feeds):
        """Part A on `feeds`: (user outputs and watched values as arrays, gradients and new
        state as OrtValues on the device, the loss's element count)."""
        step = self._step
        n_user, n_grads = len(step._user), len(step._grads)
        on_host = step._user + [step._count]
        on_device = step._grads + [o for _, o in step._state_a]
        outs = self._run(step._a, self._inputs(step._inputs_a, feeds), on_device, on_host)
        host, device = outs[len(on_device):], outs[:len(on_device)]
        # (bound device outputs first, then host ones: binding order is output order)
        return ([v.numpy() for v in host[:n_user]], device[:n_grads],
                float(np.asarray(host[n_user].numpy())), device[n_grads:])

    def running_mean(self, mean, grads, before, count):
        """The running weighted mean after one more part: `mean` of counts `before` and
        `grads` of `count` (the first part's gradients are the mean as they are)."""
        if mean is None:
            return grads
        total = before + count
        return self._mean.run(self, mean, grads, before / total, count / total)

    def update(self, feeds, grads):
        """Part B on the combined `grads` (OrtValues): its new state, as OrtValues."""
        step = self._step
        inputs = self._inputs(step._inputs_b, feeds, dict(zip(step._grads, grads)))
        return self._run(step._b, inputs, [o for _, o in step._state_b], [])

    def stored(self, value):
        """An OrtValue this path made, as the session's store keeps a variable."""
        return value if self._device == "cuda" else value.numpy()


class MeanUpdate:
    """out_i = acc_i * a + g_i * b for every gradient i, one session (a and b float32
    scalars, cast to each gradient's dtype)."""

    def __init__(self, create_session, grad_types):
        nodes, inputs, outputs = [], [], []
        scalars = [helper.make_tensor_value_info(s, TensorProto.FLOAT, []) for s in "ab"]
        cast = {}
        for i, elem_type in enumerate(grad_types):
            if elem_type not in cast:
                cast[elem_type] = (f"a_{elem_type}", f"b_{elem_type}")
                nodes += [helper.make_node("Cast", [s], [f"{s}_{elem_type}"], to=elem_type)
                          for s in "ab"]
            a, b = cast[elem_type]
            nodes += [helper.make_node("Mul", [f"acc_{i}", a], [f"acc_a_{i}"]),
                      helper.make_node("Mul", [f"g_{i}", b], [f"g_b_{i}"]),
                      helper.make_node("Add", [f"acc_a_{i}", f"g_b_{i}"], [f"out_{i}"])]
            inputs += [helper.make_tensor_value_info(f"{n}_{i}", elem_type, None)
                       for n in ("acc", "g")]
            outputs.append(helper.make_tensor_value_info(f"out_{i}", elem_type, None))
        graph = helper.make_graph(nodes, "gradient_running_mean", inputs + scalars, outputs)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                  ir_version=8)
        self._session = create_session(model.SerializeToString())
        self._outputs = [o.name for o in outputs]

    def run(self, runs, mean, grads, a, b):
        inputs = {"a": np.float32(a), "b": np.float32(b)}
        for i, (m, g) in enumerate(zip(mean, grads)):
            inputs[f"acc_{i}"], inputs[f"g_{i}"] = m, g
        return runs._run(self._session, inputs, self._outputs, [])

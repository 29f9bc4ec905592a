"""Train steps that write variables over their own values (graph/in_place.py,
runtime/in_place.py): which variables qualify, and steps that compute exactly what steps
writing new values compute."""
import numpy as np
import onnx_ir as ir
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.graph.in_place import in_place_state
from onnxjob.runtime.session import default_session

F32 = ir.DataType.FLOAT


def _graph(build):
    """(graph, {name: input value}) of `build(inputs, add) -> [outputs]` over float32 (4,)
    inputs w, m, x; add(op, inputs, **attributes) appends a node of a (4,) output."""
    inputs = {n: ir.Value(name=n, type=ir.TensorType(F32), shape=ir.Shape([4]))
              for n in ("w", "m", "x")}
    graph = ir.Graph(list(inputs.values()), [], nodes=[], opset_imports={"": 17})

    def add(op_type, args, shape=(4,), **attributes):
        node = ir.node(op_type, args, attributes=attributes)
        node.outputs[0].type, node.outputs[0].shape = ir.TensorType(F32), ir.Shape(list(shape))
        graph.append(node)
        return node.outputs[0]
    for i, value in enumerate(build(inputs, add)):
        value.name = f"out{i}"
        graph.outputs.append(value)
    return graph


def _safe(build, pairs):
    graph = _graph(build)
    return in_place_state(graph, {v: v for v, _ in pairs}, dict(pairs))


def test_an_update_whose_readers_ran_before_it_is_written_in_place():
    """m' = 0.9 m + g and w' = w - m' where the gradient g of w's forward product and
    the loss read w: every reader of w and m is an ancestor of its writer."""
    def build(v, add):
        y = add("Mul", [v["w"], v["x"]])             # the forward reads w
        g = add("Mul", [y, v["x"]])                  # its gradient
        m2 = add("Add", [add("Mul", [v["m"], v["m"]]), g])
        return [add("Sub", [v["w"], m2]), m2]
    assert _safe(build, [("w", "out0"), ("m", "out1")]) == {"w", "m"}


def test_a_reader_outside_the_update_s_ancestors_keeps_its_variable_out_of_place():
    """A second output reads w (as a previous layer's gradient reads a weight): nothing
    orders it before w' is written, so w is not written in place; m still is."""
    def build(v, add):
        g = add("Mul", [v["x"], v["x"]])
        m2 = add("Add", [v["m"], g])
        return [add("Sub", [v["w"], m2]), m2, add("Mul", [v["w"], v["x"]])]
    assert _safe(build, [("w", "out0"), ("m", "out1")]) == {"m"}


@pytest.mark.parametrize("copy", ["Cast", "Transpose", "Identity"])
def test_a_reader_of_a_copy_that_onnxruntime_may_fold_counts_as_a_reader(copy):
    """onnxruntime may remove a cast or fuse a transpose into its reader, which then reads
    w itself."""
    def build(v, add):
        attributes = {"to": F32.value} if copy == "Cast" else {}
        copied = add(copy, [v["w"]], **attributes)
        return [add("Sub", [v["w"], v["x"]]), add("Mul", [copied, v["x"]])]
    assert _safe(build, [("w", "out0")]) == set()


def test_a_writer_reading_w_must_be_elementwise_over_w_s_shape():
    """A running sum of w written over w would read elements already written."""
    def build(v, add):
        return [add("CumSum", [v["w"], ir.Value(name="axis", const_value=ir.tensor(
            np.array(0, np.int64)))])]
    assert _safe(build, [("w", "out0")]) == set()


def test_a_writer_that_does_not_read_w_may_be_any_op():
    """w' made from values that were read out of w earlier (a sum, as the small variables
    updated as one are split out of their concatenation's new value): written in place."""
    def build(v, add):
        total = add("ReduceSum", [v["w"]], shape=(1,), keepdims=1)
        return [add("Expand", [total, ir.Value(name="s", const_value=ir.tensor(
            np.array([4], np.int64)))])]
    assert _safe(build, [("w", "out0")]) == {"w"}


def _conv_net_job(config, optimizer):
    @flow.global_function(type="train", function_config=config)
    def job(x: tp.Numpy.Placeholder((4, 3, 8, 8)),
            y: tp.Numpy.Placeholder((4,), dtype=flow.int32)) -> tp.Numpy:
        init = flow.random_normal_initializer(stddev=0.2)
        h = flow.layers.conv2d(x, 6, 3, padding="SAME", kernel_initializer=init, name="c1")
        h = flow.nn.relu(flow.layers.batch_normalization(h, axis=1, name="bn1"))
        h = flow.layers.conv2d(h, 6, 3, padding="SAME", kernel_initializer=init, name="c2")
        logits = flow.layers.dense(flow.reshape(h, (4, -1)), 5, kernel_initializer=init,
                                   name="out")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        optimizer().minimize(loss)
        return loss
    return job


OPTIMIZERS = {
    "momentum": lambda: flow.optimizer.SGD(
        flow.optimizer.PiecewiseConstantScheduler([], [0.05]), momentum=0.9),
    "adam_dynamic_loss_scale": lambda: flow.optimizer.Adam(
        flow.optimizer.PiecewiseConstantScheduler([], [0.01]), do_bias_correction=True,
        loss_scale_policy=flow.optimizer.loss_scale.dynamic_loss_scale(
            initial_loss_scale=1024.0, increment_period=2)),
    "lamb_clipped": lambda: flow.optimizer.LAMB(
        flow.optimizer.PolynomialScheduler(0.01, 10, 0.0),
        grad_clipping=flow.optimizer.grad_clipping.by_global_norm(1.0)),
}


def _train(optimizer, in_place, amp=False, steps=6):
    flow.clear_default_session()
    flow.config.seed(3)
    config = flow.function_config()
    config.enable_inplace(in_place)
    config.enable_auto_mixed_precision(amp)
    job = _conv_net_job(config, OPTIMIZERS[optimizer])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3, 8, 8)).astype(np.float32)
    y = rng.integers(0, 5, 4).astype(np.int32)
    job(x, y)
    session = default_session()
    runtime = session.runtimes[job.job.name]
    arrays = {v: session.variable_values[v] for v in runtime._in_place}
    losses = [job(x, y) for _ in range(steps)]
    # the variables written in place are still the arrays they were: no new ones a step
    assert all(session.variable_values[v] is a for v, a in arrays.items())
    values = {k: v.numpy() for k, v in flow.get_all_variables().items()}
    return losses, values, set(runtime._in_place)


@pytest.mark.parametrize("amp", [False, True], ids=["float32", "amp"])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_steps_in_place_compute_what_steps_with_new_values_compute(optimizer, amp):
    losses, values, in_place = _train(optimizer, True, amp)
    their_losses, their_values, none = _train(optimizer, False, amp)
    assert not none and in_place
    if optimizer != "momentum":     # every update waits for every gradient
        assert {"c1-weight", "c2-weight", "out-weight"} <= in_place, in_place
    _assert_same_steps(losses, values, their_losses, their_values)


def test_a_predict_job_sees_the_values_written_in_place():
    """The frozen predict session (variables baked in as constants after a few calls) is
    made again when a train step writes its variables in place."""
    flow.clear_default_session()
    config = flow.function_config()
    config.freeze_variables_after(1)

    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        w = flow.get_variable("w", (3,), initializer=flow.ones_initializer())
        loss = flow.math.reduce_sum(flow.math.square(w * x))
        flow.optimizer.Adam(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                            loss_scale_policy=flow.optimizer.loss_scale.dynamic_loss_scale(
                                initial_loss_scale=2.0)).minimize(loss)
        return loss

    @flow.global_function(type="predict", function_config=config)
    def predict(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        return flow.get_variable("w", (3,), initializer=flow.ones_initializer()) * x

    x = np.ones((2, 3), np.float32)
    for _ in range(3):
        predict(x)
    train(x)
    assert "w" in default_session().runtimes["train"]._in_place
    w = flow.get_all_variables()["w"].numpy()
    assert not np.array_equal(w, np.ones(3, np.float32))
    np.testing.assert_array_equal(predict(x), x * w)
    flow.clear_default_session()


def _job_after_one_step_on_the_cpu():
    """(job, its runtime, the feeds by placeholder) of the conv net with Adam and a dynamic
    loss scale (every variable written in place), after one step on the CPU (also where a
    GPU is: the CUDA runners are run here over CPU OrtValues)."""
    flow.clear_default_session()
    flow.config.seed(3)
    config = flow.function_config()
    config.execution_provider("cpu")
    job = _conv_net_job(config, OPTIMIZERS["adam_dynamic_loss_scale"])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3, 8, 8)).astype(np.float32)
    y = rng.integers(0, 5, 4).astype(np.int32)
    job(x, y)
    runtime = default_session().runtimes["job"]
    return job, runtime, dict(zip(runtime.compiled.placeholder_names, (x, y)))


def _cpu_steps(steps=4):
    """The losses of `steps` more CPU steps and the variables after them."""
    job, _, feeds = _job_after_one_step_on_the_cpu()
    losses = [job(*feeds.values()) for _ in range(steps)]
    return losses, {k: v.numpy() for k, v in flow.get_all_variables().items()}


def _assert_same_steps(losses, values, their_losses, their_values):
    for ours, theirs in zip(losses, their_losses):
        np.testing.assert_array_equal(ours, theirs)
    for name, value in their_values.items():
        np.testing.assert_array_equal(values[name], value, err_msg=name)
    flow.clear_default_session()


def test_the_cuda_step_writes_in_place_as_the_cpu_step():
    """The CUDA step's binding (runtime/session.py _run_cuda: the variables' OrtValues as
    inputs and, for the in-place ones, as outputs) run here over CPU OrtValues: the same
    losses and variables as the CPU step, bit for bit, and each in-place variable keeps
    the OrtValue it had (the one that owns its memory)."""
    import onnxruntime as ort

    _, runtime, feeds = _job_after_one_step_on_the_cpu()
    store = runtime.store
    for name in list(store):
        store[name] = ort.OrtValue.ortvalue_from_numpy(np.array(store[name]))
    kept = {v: store[v] for v in runtime._in_place}
    losses = [runtime._run_cuda(dict(feeds))[0]]
    assert kept and all(store[v] is value for v, value in kept.items())
    losses += [runtime._run_cuda(dict(feeds))[0] for _ in range(3)]
    values = {k: v.numpy() for k, v in store.items()}
    _assert_same_steps(losses, values, *_cpu_steps())


class _CapturingLikeOnnxruntime:
    """A CPU session that runs a graph id's first `run_with_iobinding` as onnxruntime's CUDA
    EP does when it captures a CUDA graph: regular runs that size its arena, the capture
    (which computes nothing) and a replay, all in the one call: here three runs."""

    def __init__(self, session):
        self._session = session
        self._captured = set()
        self.get_outputs, self.io_binding = session.get_outputs, session.io_binding

    def run_with_iobinding(self, binding, run_options):
        graph_id = run_options.get_run_config_entry("gpu_graph_id")
        for _ in range(1 if graph_id in self._captured else 3):
            self._session.run_with_iobinding(binding)
        self._captured.add(graph_id)


def test_cuda_graph_steps_write_in_place_as_the_cpu_step(monkeypatch):
    """runtime/cuda_graph.py over CPU OrtValues and a session that executes the first run of
    each graph id three times: capturing the two graphs does not advance the variables
    written in place (the steps give the CPU step's losses and variables, bit for bit)."""
    import onnxruntime as ort

    from onnxjob.runtime import cuda_graph

    owners = []     # a CPU OrtValue made from NumPy uses the array's memory: kept alive

    def cpu_value(array):
        owners.append(np.array(array))
        return ort.OrtValue.ortvalue_from_numpy(owners[-1])
    monkeypatch.setattr(cuda_graph, "_device_value", cpu_value)
    monkeypatch.setattr(cuda_graph, "_device_buffer",
                        lambda shape, dtype: cpu_value(np.zeros(shape, dtype)))

    _, runtime, feeds = _job_after_one_step_on_the_cpu()
    assert runtime._in_place
    runner = cuda_graph.CudaGraphRunner(
        _CapturingLikeOnnxruntime(runtime.ort_session), runtime._variable_inputs,
        runtime._state_items, runtime._user_outputs, runtime.store, runtime._in_place)
    losses = [np.array(runner.run(feeds)[0]) for _ in range(4)]   # (a CPU view: copied)
    values = {k: np.asarray(v.numpy()) for k, v in runtime.store.items()}
    _assert_same_steps(losses, values, *_cpu_steps())


def test_cuda_graph_binds_the_stored_device_values_without_a_copy(monkeypatch):
    """The runner's first buffer set is the store's own device values (no second copy of
    the state); its steps are the CPU step's, bit for bit (CPU OrtValues standing for the
    device's, as above)."""
    import onnxruntime as ort

    from onnxjob.runtime import cuda_graph

    owners = []

    def cpu_value(array):
        owners.append(np.array(array))
        return ort.OrtValue.ortvalue_from_numpy(owners[-1])
    monkeypatch.setattr(cuda_graph, "_DEVICE", "cpu")
    monkeypatch.setattr(cuda_graph, "_device_value", cpu_value)
    monkeypatch.setattr(cuda_graph, "_device_buffer",
                        lambda shape, dtype: cpu_value(np.zeros(shape, dtype)))
    _, runtime, feeds = _job_after_one_step_on_the_cpu()
    store = runtime.store
    for name in list(store):
        store[name] = cpu_value(store[name])
    stored = {v: store[v] for v, _ in runtime._variable_inputs}
    made = len(owners)
    runner = cuda_graph.CudaGraphRunner(
        _CapturingLikeOnnxruntime(runtime.ort_session), runtime._variable_inputs,
        runtime._state_items, runtime._user_outputs, store, runtime._in_place)
    losses = [np.array(runner.run(feeds)[0]) for _ in range(4)]
    assert all(runner._sets[0][v] is value for v, value in stored.items())
    # new buffers: the feeds, the outputs and the second set's non-in-place variables only
    second = [v for v, _ in runtime._state_items if v not in runtime._in_place]
    assert len(owners) - made == len(feeds) + len(runtime._user_outputs) + len(second)
    values = {k: np.asarray(v.numpy()) for k, v in store.items()}
    _assert_same_steps(losses, values, *_cpu_steps())


def _lazy_adam_steps(in_place, steps=4):
    """A row-sparse LazyAdam embedding (indexed_slices_optimizer_conf) whose loss reads the
    rows it looks up (so the forward's lookup is an ancestor of the update): the tables
    after each step and the variables written in place."""
    flow.clear_default_session()
    flow.config.seed(5)
    config = flow.function_config()
    config.enable_inplace(in_place)
    config.execution_provider("cpu")
    config.indexed_slices_optimizer_conf(dict(include_op_names=dict(op_name=["emb"])))

    @flow.global_function(type="train", function_config=config)
    def job(ids: tp.Numpy.Placeholder((3, 2), dtype=flow.int32)) -> tp.Numpy:
        table = flow.get_variable("emb", (12, 4),
                                  initializer=flow.random_normal_initializer())
        rows = flow.gather(table, ids)
        loss = flow.math.reduce_sum(flow.math.square(rows - 0.5))
        flow.optimizer.LazyAdam(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(
            loss)
        return loss

    rng = np.random.default_rng(0)
    tables = []
    for _ in range(steps):
        job(rng.integers(0, 6, (3, 2)).astype(np.int32))     # rows 6..11 never looked up
        tables.append({k: v.numpy().copy() for k, v in flow.get_all_variables().items()})
    written = set(default_session().runtimes["job"]._in_place)
    flow.clear_default_session()
    return tables, written


def test_a_row_sparse_update_writes_its_rows_into_the_table_in_place():
    """LazyAdam's update is a ScatterND of the looked-up rows (train/optimizer.py
    _update_rows): written over the table and its slots, it computes what writing new
    tables computes, bit for bit, and the rows never looked up keep their first values."""
    ours, written = _lazy_adam_steps(in_place=True)
    theirs, none = _lazy_adam_steps(in_place=False)
    assert {"emb", "emb-m", "emb-v"} <= written and not none
    for a, b in zip(ours, theirs):
        for name in b:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    np.testing.assert_array_equal(ours[-1]["emb"][6:], ours[0]["emb"][6:])
    assert not np.array_equal(ours[-1]["emb"][:6], ours[0]["emb"][:6])

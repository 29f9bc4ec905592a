"""function_config.dynamic_batch(True) and export(dynamic_batch=True): predict jobs that
take any number of rows up to their placeholders' batch (graph/dynamic_batch.py)."""
import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.errors import JobArgumentError, TraceError
from onnxjob.runtime.session import default_session

import models

THIS_FILE = os.path.basename(__file__)
ROOT = os.path.join(os.path.dirname(__file__), "..")
B = 8


def dynamic_config(freeze_after=None):
    config = flow.function_config()
    config.dynamic_batch(True)
    if freeze_after is not None:
        config.freeze_variables_after(freeze_after)
    return config


def assert_rows_equal(part, full, n):
    """`part` is the first `n` rows of `full` (rtol 1e-5 of the output's scale: a kernel
    may change with the row count, e.g. Gemm with one row)."""
    assert part.shape == (n,) + full.shape[1:]
    scale = float(np.abs(full).max())
    np.testing.assert_allclose(part, full[:n], rtol=1e-5, atol=1e-5 * scale)


def images(shape, seed=0):
    return np.random.RandomState(seed).randn(*shape).astype(np.float32)


@pytest.mark.parametrize("net", [models.lenet, models.mlp], ids=["lenet", "mlp"])
def test_fewer_rows_equal_the_slices_of_the_full_batch(net):
    shape = (B, 1, 28, 28)

    @flow.global_function(type="predict")
    def fixed(x: tp.Numpy.Placeholder(shape, dtype=flow.float)) -> tp.Numpy:
        return net(x)

    # from the 2nd call on, the session with the variables as constants (runtime/frozen.py)
    @flow.global_function(type="predict", function_config=dynamic_config(freeze_after=2))
    def dynamic(x: tp.Numpy.Placeholder(shape, dtype=flow.float)) -> tp.Numpy:
        return net(x)     # the same variables (by name) as `fixed`

    x = images(shape)
    full = fixed(x)
    for n in (1, 7, B, 3, 1, 5):
        assert_rows_equal(dynamic(x[:n]), full, n)
    assert default_session().runtimes["dynamic"]._frozen._session is not None
    # OneFlow's rule stays for the job without the flag
    with pytest.raises(JobArgumentError, match="expected exactly"):
        fixed(x[:3])


def test_resnet50_predict_job_with_fewer_rows():
    import zoo
    zoo.cnns_dir()
    build, args = zoo.model_builder("resnet50"), zoo.model_args()

    @flow.global_function(type="predict", function_config=dynamic_config())
    def predict(x: tp.Numpy.Placeholder((B, 3, 224, 224), dtype=flow.float)) -> tp.Numpy:
        return build(x, args)   # resnet_model.py: flow.reshape(pool5, (pool5.shape[0], -1))

    x = images((B, 3, 224, 224))
    full = predict(x)
    assert full.shape == (B, 1000)
    for n in (1, 3):
        assert_rows_equal(predict(x[:n]), full, n)


def two_input_job():
    @flow.global_function(type="predict", function_config=dynamic_config())
    def job(x: tp.Numpy.Placeholder((B, 3)), y: tp.Numpy.Placeholder((B, 3))) -> tp.Numpy:
        w = flow.get_variable("w", (3, 2), initializer=flow.random_normal_initializer())
        return flow.matmul(x + y, w)
    return job


def test_several_inputs_and_dtype_conversion():
    job = two_input_job()
    x, y = images((B, 3)), images((B, 3), 1)
    full = job(x, y)
    assert_rows_equal(job(x[:5], y[:5]), full, 5)
    assert_rows_equal(job(x[:2].astype(np.float64), y[:2]), full, 2)


def test_too_many_rows_and_different_row_counts_name_the_call_line():
    job = two_input_job()
    x = images((B + 1, 3))
    with pytest.raises(JobArgumentError) as e:
        job(x, x)
    assert THIS_FILE in str(e.value) and f"at most {B} rows" in str(e.value)
    with pytest.raises(JobArgumentError) as e:
        job(x[:3], x[:4])
    assert THIS_FILE in str(e.value) and "same number of rows" in str(e.value)
    assert "'x': 3" in str(e.value) and "'y': 4" in str(e.value)
    with pytest.raises(JobArgumentError) as e:
        job(x[:3], x[:B])      # a full batch and a partial one
    assert "same number of rows" in str(e.value)
    with pytest.raises(JobArgumentError, match="expected exactly"):
        job(x[:3, :2], x[:3, :2])   # the other axes keep the placeholder's sizes


def test_a_constant_sized_by_the_batch_is_refused_at_its_line():
    @flow.global_function(type="predict", function_config=dynamic_config())
    def job(x: tp.Numpy.Placeholder((B, 3))) -> tp.Numpy:
        return x + flow.constant(1.0, shape=(B, 3))  # the batch as a number

    with pytest.raises(TraceError) as e:
        job(images((2, 3)))
    msg = str(e.value)
    assert "dynamic batch" in msg and f"{THIS_FILE}:" in msg and "Add" in msg


def test_an_output_without_the_rows_is_refused():
    @flow.global_function(type="predict", function_config=dynamic_config())
    def job(x: tp.Numpy.Placeholder((B, 3))) -> tp.Numpy:
        return flow.math.reduce_sum(x, axis=0)   # one value per column, not per row

    with pytest.raises(TraceError) as e:
        job(images((B, 3)))
    assert "one row per input row" in str(e.value) and THIS_FILE in str(e.value)


def test_a_reshape_that_mixes_the_batch_is_refused():
    @flow.global_function(type="predict", function_config=dynamic_config())
    def job(x: tp.Numpy.Placeholder((B, 3))) -> tp.Numpy:
        return flow.reshape(x, (3, B))

    with pytest.raises(TraceError) as e:
        job(images((B, 3)))
    assert "Reshape" in str(e.value) and THIS_FILE in str(e.value)


def test_a_callback_job_copies_its_rows():
    config = dynamic_config()

    @flow.global_function(type="predict", function_config=config)
    def job(x: tp.Numpy.Placeholder((B, 3))) -> tp.Callback[tp.Numpy]:
        return x * 2.0

    got = []
    x = images((B, 3))
    part = x[:3].copy()
    job(part)(got.append)
    part[:] = 0     # the caller may reuse its array at once
    flow.sync_default_session()
    np.testing.assert_array_equal(got[0], x[:3] * 2.0)


def test_the_flag_is_for_predict_jobs():
    @flow.global_function(type="train", function_config=dynamic_config())
    def train(x: tp.Numpy.Placeholder((B, 3))) -> tp.Numpy:
        w = flow.get_variable("w", (3, 1), initializer=flow.ones_initializer())
        loss = flow.math.reduce_mean(flow.matmul(x, w))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)
        return loss

    with pytest.raises(TraceError, match="predict jobs"):
        train(images((B, 3)))


def run_file(path, x):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def test_export_with_a_symbolic_batch(tmp_path):
    shape = (B, 1, 28, 28)

    @flow.global_function(type="predict")
    def predict(x: tp.Numpy.Placeholder(shape, dtype=flow.float)) -> tp.Numpy:
        return models.lenet(x)

    x = images(shape)
    full = predict(x)
    path = flow.export(predict, str(tmp_path / "lenet.onnx"), dynamic_batch=True)
    model = onnx.load(path)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert model.graph.output[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    for n in (1, 7, B):
        assert_rows_equal(run_file(path, x[:n]), full, n)
    # without the argument the file keeps OneFlow's fixed batch
    fixed = onnx.load(flow.export(predict, str(tmp_path / "fixed.onnx")))
    assert fixed.graph.input[0].type.tensor_type.shape.dim[0].dim_value == B


def test_export_of_a_dynamic_job_and_back_to_a_fixed_batch(tmp_path):
    job = two_input_job()
    x = images((B, 3))
    job(x, x)
    dynamic = onnx.load(flow.export(job, str(tmp_path / "d.onnx")))
    assert all(v.type.tensor_type.shape.dim[0].dim_param == "batch" for v in dynamic.graph.input)
    fixed = onnx.load(flow.export(job, str(tmp_path / "f.onnx"), dynamic_batch=False))
    assert all(v.type.tensor_type.shape.dim[0].dim_value == B for v in fixed.graph.input)


def test_export_command_line_dynamic_batch(tmp_path):
    script = tmp_path / "job_script.py"
    script.write_text(
        "import onnxjob as flow\nimport onnxjob.typing as tp\n\n"
        "@flow.global_function()\n"
        "def predict(x: tp.Numpy.Placeholder((8, 3))) -> tp.Numpy:\n"
        "    w = flow.get_variable('w', (3, 4), initializer=flow.ones_initializer())\n"
        "    return flow.reshape(flow.matmul(x, w), (x.shape[0], 2, 2))\n")
    out = tmp_path / "m.onnx"
    subprocess.run([sys.executable, "-m", "onnxjob", "export", f"{script}:predict", "-o",
                    str(out), "--dynamic-batch"], check=True, cwd=ROOT, capture_output=True)
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)
    for n in (1, 7, 8):
        x = np.ones((n, 3), np.float32)
        np.testing.assert_array_equal(run_file(out, x), np.full((n, 2, 2), 3.0, np.float32))

"""flow.experimental.custom_op_module: OneFlow's custom ops with a Python kernel, run in
onnxruntime through onnxruntime-extensions (onnxjob/frontend/custom_op_module.py,
onnxjob/ops/python_kernels.py)."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.errors import UnsupportedAPIError
from onnxjob.frontend.custom_op_module import read_cpp_definitions

pytest.importorskip("onnxruntime_extensions", reason="the pyop extra (onnxruntime-extensions)")

THIS_FILE = os.path.basename(__file__)

# as OneFlow's test/custom_ops/user_sigmoid/user_sigmoid_cpp_def.cpp registers its op types
CPP_DEF = """
#include "oneflow/core/framework/framework.h"
namespace oneflow {
REGISTER_USER_OP("{name}_forward")
    .Input("x")
    .OptionalInput("scale")
    .Output("y")
    .Output("count")
    .Attr<std::string>("device_sub_tag", "py")
    .Attr<int64_t>("axis")
    .SetTensorDescInferFn([](user_op::InferContext* ctx) -> Maybe<void> {
      *ctx->Shape4ArgNameAndIndex("y", 0) = *ctx->Shape4ArgNameAndIndex("x", 0);
      return Maybe<void>::Ok();
    });
REGISTER_USER_OP("{name}_backward")
    .Input("y")
    .Input("dy")
    .Output("dx");
REGISTER_USER_OP("{name}_cpp_only")
    .Input("x")
    .Output("y");
}
"""

PY_API = """
import onnxjob as flow

def forward(x, scale=None):
    builder = flow.user_op_builder("{name}_fw").Op("{name}_forward").Input("x", [x])
    if scale is not None:
        builder = builder.Input("scale", [scale])
    op = builder.Output("y").Output("count").Attr("axis", 1).Build()
    return op.InferAndTryRun().RemoteBlobList()

def backward(y, dy):
    return (flow.user_op_builder("{name}_bw").Op("{name}_backward").Input("y", [y])
            .Input("dy", [dy]).Output("dx").Build().InferAndTryRun().SoleOutputBlob())

def cpp_only(x):
    return (flow.user_op_builder("{name}_c").Op("{name}_cpp_only").Input("x", [x])
            .Output("y").Build().InferAndTryRun().SoleOutputBlob())
"""

PY_KERNEL = """
import numpy as np
calls = []

def forward(args):
    calls.append(len(args))
    x = args[0]
    scale = args[1] if len(args) > 1 else 1
    return (x * x * scale).astype(x.dtype), np.array([x.size], dtype=np.int64)

def backward(args):
    y, dy = args
    return 2 * np.sqrt(y) * dy
"""


def _module(tmp_path, name):
    """A custom op folder `tmp_path/name` as OneFlow's custom_op_module reads it."""
    folder = tmp_path / name
    folder.mkdir()
    for suffix, text in (("cpp_def.cpp", CPP_DEF), ("py_api.py", PY_API),
                         ("py_kernel.py", PY_KERNEL)):
        (folder / f"{name}_{suffix}").write_text(textwrap.dedent(text).replace("{name}", name))
    module = flow.experimental.custom_op_module(name, str(tmp_path))
    return module.py_api().cpp_def().py_kernel().build_load()


def test_the_cpp_definition_gives_the_op_types_arguments_and_attributes():
    found = read_cpp_definitions(CPP_DEF.replace("{name}", "sq"))
    assert found == {
        "sq_forward": "x, scale? -> y, count | device_sub_tag: string, axis: int64",
        "sq_backward": "y, dy -> dx | ",
        "sq_cpp_only": "x -> y | "}


def test_a_python_kernel_runs_in_the_job_with_the_blobs_dtypes(tmp_path):
    """The kernel gets the blobs' dtypes and shapes; its outputs (any dtype, several)
    come back as it returns them; an optional input is passed when given."""
    op = _module(tmp_path, "user_square")
    flow.clear_default_session()

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2, 3)), s: tp.Numpy.Placeholder((2, 3))
            ) -> tp.Bundle[tp.Numpy]:
        y, count = op.api.forward(x)
        scaled, _ = op.api.forward(flow.math.relu(x), s)
        return y, count, scaled, op.api.backward(y, s)

    x = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
    s = np.full((2, 3), 0.5, np.float32)
    y, count, scaled, dx = job(x, s)
    np.testing.assert_array_equal(y, x * x)
    assert y.dtype == np.float32 and count.dtype == np.int64 and count.tolist() == [6]
    np.testing.assert_array_equal(scaled, np.maximum(x, 0) ** 2 * 0.5)
    np.testing.assert_allclose(dx, 2 * np.abs(x) * s, rtol=1e-6)
    assert 2 in op.kernel.calls                      # the optional input reached the kernel
    # exported: said at the export's line; the file runs where the PyOps are registered
    with pytest.warns(UserWarning, match="Python kernels") as caught:
        flow.export(job, str(tmp_path / "m.onnx"))
    assert caught[0].filename == __file__
    import onnxruntime
    from onnxjob.runtime import custom_op_libraries
    options = onnxruntime.SessionOptions()
    custom_op_libraries.register_in(options)
    session = onnxruntime.InferenceSession(str(tmp_path / "m.onnx"), options,
                                           providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    np.testing.assert_array_equal(session.run(None, dict(zip(names, (x, s))))[0], x * x)


def test_an_integer_python_kernel_keeps_its_dtype(tmp_path, monkeypatch):
    """Another dtype is another kernel entry, not another onnxruntime-extensions op: an op
    registered there while sessions of earlier ones live leaves them pointing at freed
    memory (see the next test), so nothing is registered after the first op."""
    import onnxruntime_extensions
    op = _module(tmp_path, "user_square_int")
    flow.clear_default_session()

    @flow.global_function()
    def first(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        return op.api.forward(x)[0]
    first(np.ones(4, np.float32))

    def no_more(*args, **kwargs):
        raise AssertionError("an onnxruntime-extensions op registered after the first")
    monkeypatch.setattr(onnxruntime_extensions, "onnx_op", no_more)
    flow.clear_default_session()

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((4,), dtype=flow.int32)) -> tp.Numpy:
        return op.api.forward(x)[0]

    x = np.array([-70000, -1, 2, 40000], np.int32)
    y = job(x)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, (x.astype(np.int64) ** 2).astype(np.int32))


def test_ops_defined_while_sessions_of_earlier_ones_live_free_cleanly(tmp_path):
    """onnxruntime-extensions keeps its ops in one growing array: an op type registered
    while a session of an earlier one lived left that session pointing at freed memory,
    and freeing it crashed the process. Here in a child process: its exit status says."""
    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent(f"""
        import gc, sys
        import numpy as np
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        import onnxjob as flow, onnxjob.typing as tp
        from test_custom_op_module import _module
        import pathlib
        root = pathlib.Path({str(tmp_path)!r})
        from onnxjob.runtime.session import default_session
        kept, sessions = [], []
        for i, dtype in enumerate((flow.float32, flow.float64, flow.int32)):
            op = _module(root, f"op{{i}}")
            flow.clear_default_session()

            @flow.global_function()
            def job(x: tp.Numpy.Placeholder((3,), dtype=dtype)) -> tp.Numpy:
                return op.api.forward(x)[0]
            kept.append(job(np.arange(3).astype(flow.convert_oneflow_dtype_to_numpy_dtype(
                dtype))))
            sessions.append(default_session())    # its onnxruntime sessions stay alive
        flow.clear_default_session()
        del sessions
        gc.collect()
        print("freed", [k.tolist() for k in kept])
        """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "freed [[0.0, 1.0, 4.0], [0.0, 1.0, 4.0], [0, 1, 4]]" in done.stdout


def test_what_cannot_run_names_the_line(tmp_path):
    """A train job through a Python kernel (its C++ gradient is not read), an op type with
    only a C++ kernel, and cpp_kernel(): UnsupportedAPIError naming the program's line."""
    op = _module(tmp_path, "user_square_train")
    flow.clear_default_session()

    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        w = flow.get_variable("w", shape=(2, 3), initializer=flow.ones_initializer())
        loss = flow.math.reduce_sum(op.api.forward(x * w)[0])
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                           momentum=0).minimize(loss)
        return loss

    with pytest.raises(UnsupportedAPIError, match="Python kernel") as raised:
        train(np.ones((2, 3), np.float32))
    assert THIS_FILE in str(raised.value)
    flow.clear_default_session()

    @flow.global_function()
    def cpp(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        return op.api.cpp_only(x)

    with pytest.raises(UnsupportedAPIError, match="no Python kernel"):
        cpp(np.ones(2, np.float32))
    with pytest.raises(UnsupportedAPIError, match="C\\+\\+ kernels") as raised:
        flow.experimental.custom_op_module("user_square_train", str(tmp_path)).cpp_kernel()
    assert THIS_FILE in str(raised.value)
    flow.clear_default_session()


def test_without_onnxruntime_extensions_the_error_says_which_extra(tmp_path, monkeypatch):
    from onnxjob.ops import python_kernels
    monkeypatch.setattr(python_kernels, "_catalog", [])
    monkeypatch.setitem(sys.modules, "onnxruntime_extensions", None)   # import fails
    op = _module(tmp_path, "user_square_missing")
    flow.clear_default_session()

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        return op.api.forward(x)[0]

    with pytest.raises(UnsupportedAPIError, match=r"onnxjob\[pyop\]") as raised:
        job(np.ones(2, np.float32))
    assert "user_square_missing_py_api.py:" in str(raised.value)     # the op's user line
    flow.clear_default_session()


SIGMOID_CPP = """
REGISTER_USER_OP("my_sigmoid_forward").Input("x").Output("y")
    .Attr<std::string>("device_sub_tag", "py");
REGISTER_USER_OP("my_sigmoid_backward").Input("y").Input("dy").Output("dx")
    .Attr<std::string>("device_sub_tag", "py");
REGISTER_USER_OP_GRAD("my_sigmoid_forward")
    .SetBackwardOpConfGenFn([](user_op::BackwardOpConfContext* ctx) -> Maybe<void> {
      const auto grad_op_name = ctx->FwOp().op_name() + "_grad";
      const auto& grad_op_func = [&ctx](user_op::BackwardOpBuilder& builder) {
        return builder.OpTypeName("my_sigmoid_backward")
            .InputBind("y", ctx->FwOp().output("y", 0))
            .InputBind("dy", ctx->FwOp().output_grad("y", 0))
            .Output("dx")
            .Build();
      };
      ctx->DefineOp(grad_op_name, grad_op_func);
      const auto& dx_get_func = [&ctx, &grad_op_name]() -> const std::string& {
        return ctx->GetOp(grad_op_name).output("dx", 0);
      };
      ctx->FwOp().InputGradBind(user_op::OpArg("x", 0), dx_get_func);
      return Maybe<void>::Ok();
    });
"""


def test_a_python_kernel_trains_with_the_gradient_its_cpp_definition_registers(tmp_path):
    """OneFlow's documented gradient registration (a backward op bound to the forward's
    output and output gradient, its output the input's gradient): a train job through the
    op takes the same steps as through flow.math.sigmoid."""
    folder = tmp_path / "my_sigmoid"
    folder.mkdir()
    (folder / "my_sigmoid_cpp_def.cpp").write_text(SIGMOID_CPP)
    (folder / "my_sigmoid_py_api.py").write_text(textwrap.dedent("""
        import onnxjob as flow
        def sigmoid(x):
            return (flow.user_op_builder("s").Op("my_sigmoid_forward").Input("x", [x])
                    .Output("y").Build().InferAndTryRun().SoleOutputBlob())
        """))
    (folder / "my_sigmoid_py_kernel.py").write_text(textwrap.dedent("""
        import numpy as np
        def forward(args):
            return 1 / (1 + np.exp(-args[0]))
        def backward(args):
            y, dy = args
            return y * (1 - y) * dy
        """))
    op = flow.experimental.custom_op_module("my_sigmoid", str(tmp_path))
    op.py_api().cpp_def().py_kernel().build_load()

    def train_twice(sigmoid):
        flow.clear_default_session()

        @flow.global_function(type="train")
        def train(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
            w = flow.get_variable("w", shape=(2, 3), initializer=flow.ones_initializer())
            loss = flow.math.reduce_sum(sigmoid(x * w) * x)
            flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.5]),
                               momentum=0).minimize(loss)
            return loss

        x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
        losses = [train(x) for _ in range(2)]
        return losses, flow.get_all_variables()["w"].numpy()

    custom, reference = train_twice(op.api.sigmoid), train_twice(flow.math.sigmoid)
    np.testing.assert_allclose(custom[0], reference[0], rtol=1e-5)
    np.testing.assert_allclose(custom[1], reference[1], rtol=1e-5)
    assert not np.allclose(custom[1], 1)                 # it moved
    flow.clear_default_session()

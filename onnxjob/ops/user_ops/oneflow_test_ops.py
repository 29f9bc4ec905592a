"""Op types OneFlow's library registers for its own tests.

OneFlow 0.5's standard build registers these in oneflow/user/ops/test_ops.cpp with their
kernels in oneflow/user/kernels/test_kernels.cpp, so any program can build them with
flow.user_op_builder; OneFlow's legacy op tests (test/ops/test_TestSource.py, ...) do.
Each is built here with its kernel's semantics:

* ccrelu: ReLU (the GPU kernel, float32), gradient ccrelu_grad(y, dy) = dy where y > 0;
  cpu_only_relu_test: ReLU (float32), no gradient registered.
* TestReshape: `in` as `shape` (same rank required); TestMultiOutputOrder: out1 = in,
  out2 = zeros with the last axis doubled (float32).
* TestSource: [0, 1, 2, 3, 4] (float32, the CPU kernel; the GPU one writes nothing);
  TestSourceMultiGpuFixedOutNum: out_num values, each device of the placement filling its
  balanced part with 0, 1, ...; TestDynamicSource: a dynamic (5,) blob holding [0, 1, 2];
  TestRandomSource: uniform floats in [0, 1) from a std::mt19937 seeded with `seed` whose
  state carries over from run to run, as the kernel's (NumPy's MT19937 is the same
  generator; the floats are made as libstdc++'s uniform_real_distribution<float> makes
  them).
* TestMultiInput: y = x1 (float32, x1 and x2 of one shape); its registered gradient,
  TestMultiInputGrad, gives x1 ones and x2 twos whatever the incoming gradient.
* TestDataTypeAttr, TestListDataTypeAndListShapeAndListStringAttr,
  test_user_op_attr_auto_type: their kernels only check attributes and leave the outputs
  unwritten; here the outputs are zeros of the shapes and dtypes the op declares.

Ops with no registered gradient are composites without a gradient rule: a train job
that needs a gradient through one fails, as in OneFlow.
"""
import numpy as np

from onnxjob import dtypes
from onnxjob.errors import TraceError
from onnxjob.graph.registry import register_composite
from onnxjob.graph.tracer import as_blob, int64_constant, op
from onnxjob.ops.casts import identity
from onnxjob.ops.creation import constant, zeros_like
from onnxjob.ops.selection import where
from onnxjob.ops.shapes import reshape
from onnxjob.ops import math as fm
from onnxjob.ops.host import to_blob
from onnxjob.ops.parallel import balanced_parts, parallel_num
from onnxjob.ops.user_ops.spec import registrar

reg = registrar("oneflow_tests")


def _where(type_name):
    return f"flow.user_op_builder: op type {type_name!r}"


def _float32(blob, type_name, what="in"):
    if blob.np_dtype != np.float32:
        raise TraceError(f"{_where(type_name)}: OneFlow's kernel takes float32 {what}, got "
                         f"{blob.np_dtype}")
    return blob


def _composite(type_name, expand, grad=None):
    """Register `expand(inputs, attrs, num_outputs)` as composite onnxjob.<type_name> (no
    gradient rule unless `grad`) and return a function emitting it."""
    name = f"onnxjob.{type_name}"
    register_composite(name, expand, grad)

    def emit(*inputs, num_outputs=1, **attrs):
        return op(name, *inputs, num_outputs=num_outputs, **attrs)
    return emit


# -- ReLUs ------------------------------------------------------------------------------------
reg("ccrelu", "in -> out", lambda x, a: fm.relu(_float32(x.one("in"), "ccrelu")),
    flow="flow.math.relu")
reg("ccrelu_grad", "y, dy -> dx",
    lambda x, a: where(fm.greater(x.one("y"), 0), x.one("dy"), zeros_like(x.one("dy"))))
_cpu_only_relu = _composite("cpu_only_relu_test", lambda i, a, n: [fm.relu(i[0])])
reg("cpu_only_relu_test", "in -> out",
    lambda x, a: _cpu_only_relu(_float32(x.one("in"), "cpu_only_relu_test")),
    flow="flow.math.relu")


# -- shapes and orders --------------------------------------------------------------------------

def _test_reshape(x, a):
    v, shape = x.one("in"), a["shape"]
    if len(shape) != len(v.shape):
        raise TraceError(f"{_where('TestReshape')}: shape {shape} must have in's rank "
                         f"{len(v.shape)}")
    return _reshape(v, shape=tuple(shape))


_reshape = _composite("TestReshape", lambda i, a, n: [reshape(i[0], a["shape"])])
reg("TestReshape", "in -> out | shape: shape", _test_reshape, flow="flow.reshape")


def _multi_output_order(inputs, attrs, n):
    v = inputs[0]
    shape = v.shape[:-1] + (v.shape[-1] * 2,)
    return [identity(v), as_blob(np.zeros(shape, np.float32), like=v)]


_order = _composite("TestMultiOutputOrder", _multi_output_order)
reg("TestMultiOutputOrder", "in -> out1, out2",
    lambda x, a: tuple(_order(_float32(x.one("in"), "TestMultiOutputOrder"), num_outputs=2)))


# -- sources ------------------------------------------------------------------------------------
reg("TestSource", "-> out", lambda x, a: constant(np.arange(5), dtypes.float32))


def _fixed_out_num(x, a):
    """Each device of the placement fills its balanced part of out_num with 0, 1, ..."""
    parts = balanced_parts(a["out_num"], parallel_num())
    values = np.concatenate([np.arange(p) for p in parts]).astype(np.float32)
    return constant(values, dtypes.float32)


reg("TestSourceMultiGpuFixedOutNum", "-> out | out_num: int64", _fixed_out_num)


def _dynamic_source(x, a):
    """A dynamic blob of static shape (5,) whose run-time value is [0, 1, 2]."""
    values = constant(np.arange(5), dtypes.float32)
    # NOTE: an end computed in the graph (not a traced constant) makes the Slice dynamic
    end = identity(int64_constant(values, [3]))
    return op("Slice", values, int64_constant(values, [0]), end, int64_constant(values, [0]))


reg("TestDynamicSource", "-> out", _dynamic_source)


def mt19937_uniform(seed):
    """A function drawing n float32 values in [0, 1) per call as OneFlow's CPU
    RandomGenerator::Uniform does: std::uniform_real_distribution<float>(0, nextafter(1))
    over one std::mt19937(seed) whose state carries over between calls."""
    state = np.random.RandomState(int(seed) % 2 ** 32)   # MT19937, init_genrand(seed)
    below_one = np.nextafter(np.float32(1), np.float32(0))
    width = np.nextafter(np.float32(1), np.float32(2))

    def draw(n):
        # one 32-bit draw per float: generate_canonical<float, 24> = float(u) / 2**32
        raw = state.randint(0, 2 ** 32, size=n, dtype=np.uint32).astype(np.float32)
        canonical = np.minimum(raw / np.float32(2 ** 32), below_one)
        return (canonical * width).astype(np.float32)
    return draw


def _random_source(x, a):
    draw = mt19937_uniform(a["seed"])
    return to_blob("TestRandomSource", lambda: draw(5), [], (5,), np.float32,
                   "flow.user_op_builder")


reg("TestRandomSource", "-> out | seed: int64", _random_source)


# -- TestMultiInput and its gradient --------------------------------------------------------------

def _constant_diffs(blobs, scale=1.0):
    """ones like the first, twos like the second (TestMultiInputGrad's kernel), times
    `scale`."""
    return [identity(as_blob(np.full(b.shape, value * scale, np.float32), like=b))
            for value, b in zip((1.0, 2.0), blobs)]


_multi_input = _composite(
    "TestMultiInput", lambda i, a, n: [identity(i[0])],
    # NOTE: the kernel ignores the incoming gradient; onnxjob's backward folds 1/elem_cnt
    # into its seed where OneFlow's optimizer applies it, so these are scaled alike
    grad=lambda node, gys, need: _constant_diffs(node.inputs,
                                                 node.inputs[0].builder.grad_seed_scale))


def _test_multi_input(x, a):
    x1, x2 = (_float32(x.one(k), "TestMultiInput", k) for k in ("x1", "x2"))
    if x1.shape != x2.shape:
        raise TraceError(f"{_where('TestMultiInput')}: x1 {x1.shape} and x2 {x2.shape} must "
                         "have one shape")
    return _multi_input(x1, x2)


reg("TestMultiInput", "x1, x2 -> y", _test_multi_input)
reg("TestMultiInputGrad", "x1, x2, y_diff -> x1_diff, x2_diff",
    lambda x, a: tuple(_constant_diffs([x.one("x1"), x.one("x2")])))


# -- ops that only check their attributes (outputs unwritten in OneFlow; zeros here) ----------

def _zeros_of(inputs, attrs, n):
    return [inputs[0].builder.constant(np.zeros(s, dtypes.to_numpy(t)))
            for s, t in zip(attrs["shapes"], attrs["types"])]


# one composite per op type, so that a missing gradient names the op type
_zeros = {t: _composite(t, _zeros_of) for t in (
    "TestDataTypeAttr", "TestListDataTypeAndListShapeAndListStringAttr",
    "test_user_op_attr_auto_type")}


def _data_type_attr(x, a):
    v = x.one("in")
    return _zeros["TestDataTypeAttr"](v, shapes=(v.shape,), types=(a["output_type"],))


reg("TestDataTypeAttr", "in -> out | output_type: dtype", _data_type_attr)


def _list_attrs(x, a):
    shapes, types = a["out_shapes"], a["out_types"]
    name = "TestListDataTypeAndListShapeAndListStringAttr"
    if len(shapes) < 3 or len(types) < 3 or not a["string_list"]:
        raise TraceError(f"{_where(name)}: out_shapes and out_types need an entry per output "
                         f"(3) and string_list at least one string, got {shapes}, {types}, "
                         f"{a['string_list']}")
    outs = _zeros[name](x.one("in"), shapes=tuple(shapes[:3]), types=tuple(types[:3]),
                        num_outputs=3)
    return {"out": outs}


reg("TestListDataTypeAndListShapeAndListStringAttr", "in -> out[3] | out_shapes: list_shape, "
    "out_types: list_dtype, string_list: list_string", _list_attrs)
reg("test_user_op_attr_auto_type", "in -> out | int1: int32, int2: int32",
    lambda x, a: _zeros["test_user_op_attr_auto_type"](
        x.one("in"), shapes=(x.one("in").shape,), types=(x.one("in").dtype,)))

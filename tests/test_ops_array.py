"""Top-level array ops and flow.random: forward values against NumPy, gradients from one
table (finite differences in float64 and PyTorch autograd), the dtypes OneFlow allows,
OneFlow 0.5's signatures, and in-graph randomness that stays random across runs."""
import inspect
import typing

import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob import dtypes
from onnxjob.errors import TraceError
from onnxjob.graph.tracer import int64_constant, op
from onnxjob.ops.selection import argwhere_with_size, unique_with_counts
from gradcheck import gradient_tests, normal, sep

torch = pytest.importorskip("torch", reason="PyTorch is the reference for gradients")
F = torch.nn.functional


def run(fn, *arrays, ret=tp.Numpy, train=False):
    """Build a job of `fn` on placeholders shaped like `arrays` and run it once."""
    flow.clear_default_session()
    params = [inspect.Parameter(f"x{i}", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                annotation=tp.Numpy.Placeholder(a.shape, dtype=_flow(a.dtype)))
              for i, a in enumerate(arrays)]

    def body(*blobs):
        return fn(*blobs)

    body.__signature__ = inspect.Signature(params, return_annotation=ret)
    job = flow.global_function(type="train" if train else "predict")(body)
    return job, job(*arrays)


def _flow(np_dtype):
    return dtypes.from_numpy(np_dtype)


def const(values):
    """An input maker returning fixed values (indices, masks)."""
    return lambda rng: np.asarray(values)


def _slice_update_torch(x, u, index):
    y = x.clone()
    y[index] = u
    return y


def _same_lower_torch(x):
    return F.pad(x, (1, 0, 1, 1))


IDX_ND = np.array([[0, 1], [3, 2], [0, 1], [2, 0], [1, 1]], np.int32)
IDX_ROWS = np.array([[4], [1], [4]], np.int32)
IDX_DISTINCT = np.array([[3], [0]], np.int64)
DIM_IDX = np.array([[1, 0, 3, 3, 2], [0, 0, 1, 2, 3], [3, 2, 1, 0, 0]], np.int64)


# name, onnxjob fn, torch fn, input makers, differentiated inputs, float64 kernels exist
CASES = [
    ("slice_v2_step2", lambda a: flow.slice_v2(a, [(None, None, None), (0, 5, 2)]),
     lambda a: a[:, 0:5:2], [normal((3, 6))], [1], True),
    ("slice_v2_negative_steps", lambda a: flow.slice_v2(a, [(None, None, -1), (4, 0, -2)]),
     lambda a: a.flip(0)[:, [4, 2]], [normal((3, 6))], [1], True),
    ("slice_v2_step3_partial", lambda a: flow.slice_v2(a, [(1, None, 3), (-5, -1, 1)]),
     lambda a: a[1::3, 1:5], [normal((8, 6))], [1], True),
    ("reverse", lambda a: flow.reverse(a, [0, 1]), lambda a: a.flip([0, 1]),
     [normal((3, 4))], [1], True),
    ("pad_constant", lambda a: flow.pad(a, [(1, 2), (0, 3)], 1.5),
     lambda a: F.pad(a, (0, 3, 1, 2), value=1.5), [normal((3, 4))], [1], True),
    ("constant_pad2d", lambda x: flow.constant_pad2d(x, [1, 2, 0, 1], -1.0),
     lambda x: F.pad(x, (1, 2, 0, 1), value=-1.0), [normal((2, 3, 4, 5))], [1], True),
    ("reflection_pad2d", lambda x: flow.reflection_pad2d(x, [2, 1, 1, 2]),
     lambda x: F.pad(x, (2, 1, 1, 2), mode="reflect"), [normal((2, 3, 4, 5))], [1], True),
    ("replication_pad2d", lambda x: flow.replication_pad2d(x, [3, 1, 0, 5]),
     lambda x: F.pad(x, (3, 1, 0, 5), mode="replicate"), [normal((1, 2, 3, 4))], [1], True),
    ("same_padding_lower", lambda x: flow.same_padding(x, "SAME_LOWER", "NCHW", [3, 2],
                                                       [2, 2], [1, 1]),
     _same_lower_torch, [normal((1, 2, 5, 7))], [1], True),
    ("gather_nd", lambda p, i: flow.gather_nd(p, i), lambda p, i: p[i[:, 0].long(), i[:, 1].long()],
     [normal((4, 3, 2)), const(IDX_ND)], [1, 0], True),
    ("scatter_nd", lambda i, u: flow.scatter_nd(i, u, [5, 2]),
     lambda i, u: torch.zeros(5, 2).index_put((i[:, 0].long(),), u, accumulate=True),
     [const(IDX_ROWS), normal((3, 2))], [0, 1], True),
    ("tensor_scatter_nd_update", lambda p, i, u: flow.tensor_scatter_nd_update(p, i, u),
     lambda p, i, u: p.index_put((i[:, 0],), u), [normal((5, 3)), const(IDX_DISTINCT),
                                                  normal((2, 3))], [1, 0, 1], True),
    ("tensor_scatter_nd_add", lambda p, i, u: flow.tensor_scatter_nd_add(p, i, u),
     lambda p, i, u: p.index_put((i[:, 0].long(),), u, accumulate=True),
     [normal((5, 2)), const(IDX_ROWS), normal((3, 2))], [1, 0, 1], True),
    ("dim_gather_dim1", lambda x, i: flow.dim_gather(x, 1, i), lambda x, i: torch.gather(x, 1, i),
     [normal((3, 4)), const(DIM_IDX)], [1, 0], True),
    ("dim_gather_dim0", lambda x, i: flow.dim_gather(x, 0, i), lambda x, i: torch.gather(x, 0, i),
     [normal((4, 5)), const(DIM_IDX)], [1, 0], True),
    ("expand", lambda x: flow.expand(x, [2, -1, 4]), lambda x: x.expand(2, 3, 4),
     [normal((3, 1))], [1], True),
    ("broadcast_like", lambda x, like: flow.broadcast_like(x, like, broadcast_axes=(1,)),
     lambda x, like: x.expand(3, 4), [normal((3, 1)), normal((3, 4))], [1, 0], True),
    ("broadcast_like_removed_axis", lambda x, like: flow.broadcast_like(x, like, [0]),
     lambda x, like: x.expand(2, 3), [normal((3,)), normal((2, 3))], [1, 0], True),
    ("tile", lambda a: op("Tile", a, int64_constant(a, [2, 3])), lambda a: a.repeat(2, 3),
     [normal((2, 3))], [1], True),
    ("where_broadcast", lambda c, a, b: flow.where(c, a, b),
     lambda c, a, b: torch.where(c.bool(), a, b),
     [const(np.array([[1], [0], [3]], np.int32)), normal((3, 4)), normal((1, 4))], [0, 1, 1], True),
    ("masked_fill", lambda a, m: flow.masked_fill(a, m, 2.5),
     lambda a, m: a.masked_fill(m.bool(), 2.5), [normal((3, 4)), const(np.int8([[1, 0, 0, 1]]))],
     [1, 0], True),
    ("stack", lambda a, b: flow.stack([a, b], axis=1), lambda a, b: torch.stack([a, b], 1),
     [normal((2, 3)), normal((2, 3))], [1, 1], True),
    ("diag_vector_above", lambda a: flow.diag(a, 1), lambda a: torch.diag(a, 1),
     [normal((3,))], [1], True),
    ("diag_vector_below", lambda a: flow.diag(a, -2), lambda a: torch.diag(a, -2),
     [normal((3,))], [1], True),
    ("diag_matrix", lambda a: flow.diag(a), lambda a: torch.diag(a), [normal((4, 3))], [1], True),
    ("diag_matrix_offsets", lambda a: flow.diag(a, -1) + flow.slice(flow.diag(a, 1), [0], [3]),
     lambda a: torch.diag(a, -1) + torch.diag(a, 1)[:3], [normal((4, 5))], [1], True),
    ("slice_update_strided", lambda x, u: flow.slice_update(x, u, [(1, 5, 2)]),
     lambda x, u: _slice_update_torch(x, u, torch.tensor([1, 3])),
     [normal((5, 3)), normal((2, 3))], [1, 1], True),
    ("slice_update_reversed", lambda x, u: flow.slice_update(x, u, [(None, None, -2), (1, 3, 1)]),
     lambda x, u: _slice_update_torch(x, u, (torch.tensor([[4], [2], [0]]), torch.tensor([1, 2]))),
     [normal((5, 4)), normal((3, 2))], [1, 1], True),
    ("gather_batch_dims", lambda p, i: flow.gather(p, i, batch_dims=1),
     lambda p, i: torch.gather(p, 1, i.long()), [normal((2, 4)), const(np.int32([[3, 0], [1, 1]]))],
     [1, 0], True),
    ("flatten_squeeze_expand_dims",
     lambda a: flow.expand_dims(flow.squeeze(flow.flatten(a, 1, 2), [2]), 0),
     lambda a: a.flatten(1, 2).squeeze(2).unsqueeze(0), [normal((2, 3, 2, 1))], [1], True),
    ("reshape_like", lambda a, like: flow.reshape_like(a, like), lambda a, like: a.reshape(3, 2),
     [normal((2, 3)), normal((3, 2))], [1, 0], True),
    ("relu_then_pad_reflect", lambda x: flow.reflection_pad2d(flow.math.relu(x), 1),
     lambda x: F.pad(torch.relu(x), (1, 1, 1, 1), mode="reflect"), [sep((1, 1, 3, 3))], [1], True),
]


test_gradient_against_finite_differences, test_gradient_against_pytorch = gradient_tests(CASES)


# -- forward values -----------------------------------------------------------------------

X34 = np.arange(12, dtype=np.float32).reshape(3, 4)


def test_argwhere_with_size_pads_with_zero_rows_after_the_count():
    x = np.array([[0, 1, 0], [2, 0, 2]], np.float32)
    _, (coords, size) = run(lambda a: argwhere_with_size(a, flow.int64), x,
                            ret=typing.Tuple[tp.Numpy, tp.Numpy])
    assert coords.dtype == np.int64 and coords.shape == (6, 2) and size.tolist() == [3]
    np.testing.assert_array_equal(coords[:3], np.argwhere(x))
    assert not coords[3:].any()


def test_where_without_x_and_y_is_argwhere_and_nonzero_its_transpose():
    x = np.array([3, 0, 1, 0, 1], np.int32)
    _, out = run(lambda c: flow.where(c), x, ret=tp.ListNumpy)
    np.testing.assert_array_equal(out[0], [[0], [2], [4]])
    cube = (np.arange(24).reshape(2, 3, 4) % 5 == 0).astype(np.int8)
    _, out = run(flow.nonzero, cube, ret=tp.ListNumpy)
    np.testing.assert_array_equal(out[0], np.stack(np.nonzero(cube)))


def test_unique_with_counts_in_order_of_first_appearance():
    x = np.array([4, 1, 4, 7, 1, 4, 9], np.int64)
    _, (y, idx, count, num) = run(lambda a: tuple(unique_with_counts(a)), x,
                                  ret=typing.Tuple[tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy])
    assert num.tolist() == [4] and idx.dtype == count.dtype == num.dtype == np.int32
    np.testing.assert_array_equal(y, [4, 1, 7, 9, 0, 0, 0])
    np.testing.assert_array_equal(idx, [0, 1, 0, 2, 1, 0, 3])
    np.testing.assert_array_equal(count, [3, 2, 1, 1, 0, 0, 0])
    np.testing.assert_array_equal(y[idx], x)


def test_unique_with_counts_keeps_nans_distinct_and_takes_out_idx():
    x = np.array([np.nan, 1.5, np.nan, 1.5], np.float32)
    _, (y, idx, count, num) = run(lambda a: tuple(unique_with_counts(a, flow.int64)), x,
                                  ret=typing.Tuple[tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy])
    assert num.tolist() == [3] and idx.dtype == np.int64
    np.testing.assert_array_equal(idx, [0, 1, 2, 1])
    np.testing.assert_array_equal(count, [1, 2, 1, 0])
    assert np.isnan(y[0]) and y[1] == 1.5 and np.isnan(y[2]) and y[3] == 0


@pytest.mark.parametrize("args,expected", [
    ((10,), np.arange(10)), ((1, 10, 3), np.arange(1, 10, 3)), ((2, 3), [2]),
])
def test_range_int64_by_default(args, expected):
    _, out = run(lambda: flow.range(*args))
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, expected)


def test_range_float_sizes_as_oneflow():
    _, out = run(lambda: flow.range(0.0, 1.0, 0.1, dtype=flow.float32))
    np.testing.assert_allclose(out, np.arange(10) * 0.1, rtol=1e-6, atol=1e-7)
    assert out.dtype == np.float32 and out.shape == (10,)


def test_slices_follow_oneflow():
    _, out = run(lambda a: flow.slice(a, [None, 1], [None, -1]), X34)
    np.testing.assert_array_equal(out, X34[:, 1:])
    _, out = run(lambda a: flow.slice_v2(a, [(None, None, -1)]), X34)
    np.testing.assert_array_equal(out, X34[::-1])
    _, out = run(lambda a: flow.slice_update(a, flow.constant(-1.0, shape=[3, 2]),
                                             [(None, None, None), (0, 4, 2)]), X34)
    expected = X34.copy()
    expected[:, 0:4:2] = -1
    np.testing.assert_array_equal(out, expected)


def test_scatter_ops_sum_repeated_indices_as_oneflow():
    idx = np.array([[1], [1], [3]], np.int32)
    upd = np.array([[1, 2], [10, 20], [5, 5]], np.float32)
    params = np.ones((4, 2), np.float32)
    _, out = run(lambda i, u: flow.scatter_nd(i, u, [4, 2]), idx, upd)
    np.testing.assert_array_equal(out, [[0, 0], [11, 22], [0, 0], [5, 5]])
    _, out = run(flow.tensor_scatter_nd_update, params, idx, upd)
    np.testing.assert_array_equal(out, [[1, 1], [11, 22], [1, 1], [5, 5]])
    _, out = run(flow.tensor_scatter_nd_add, params, idx, upd)
    np.testing.assert_array_equal(out, [[1, 1], [12, 23], [1, 1], [6, 6]])


def test_misc_forward_values():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    checks = [
        (lambda a: flow.expand(a, [4, 2, -1]), np.broadcast_to(x, (4, 2, 3))),
        (lambda a: flow.stack([a, a * 2.0], axis=-1), np.stack([x, x * 2], -1)),
        (lambda a: flow.reshape(a, [3, -1]), x.reshape(3, 2)),
        (lambda a: flow.flatten(a), x.reshape(6)),
        (lambda a: flow.transpose(a), x.T),
        (lambda a: flow.ones([2, 2]) + flow.zeros([2, 2]), np.ones((2, 2), np.float32)),
        (lambda a: flow.constant_scalar(3, flow.int32), np.int32([3])),
        (lambda a: flow.elem_cnt(a), np.int32(6)),
        (lambda a: flow.elem_cnt(a, flow.int64), np.int64(6)),
        (lambda a: flow.pad_grad(a, [(0, 1), (1, 1)]), x[:1, 1:2]),
        (lambda a: flow.identity(flow.amp_white_identity(a)), x),
        (lambda a: flow.cast_to_static_shape(flow.dynamic_reshape(a, [-1, 2])),
         x.reshape(3, 2)),
        (lambda a: flow.masked_fill(a, flow.constant(1, flow.int8, [2, 1]), -7),
         np.full((2, 3), -7, np.float32)),
        (lambda a: flow.where(a > 2.0, a, 0.0), np.where(x > 2, x, np.float32(0))),
    ]
    for fn, expected in checks:
        _, out = run(fn, x)
        np.testing.assert_array_equal(out, expected)
        assert out.dtype == np.asarray(expected).dtype


def test_same_padding_upper_puts_the_odd_pixel_last():
    x = np.ones((1, 5, 7, 2), np.float32)
    _, out = run(lambda a: flow.same_padding(a, "same_upper", "NHWC", [3, 2], [2, 2], [1, 1]), x)
    np.testing.assert_array_equal(out, np.pad(x, [(0, 0), (1, 1), (0, 1), (0, 0)]))


# -- dtypes -------------------------------------------------------------------------------

DTYPES = [np.float32, np.float64, np.int32, np.int64, np.int8]
V = (np.arange(24) % 7).reshape(2, 3, 4)
M = np.arange(12).reshape(3, 4) % 5
I32 = np.array([[1, 0], [0, 2]], np.int32)


def _rows(a, n):
    return flow.slice(a, [0, None], [n, None])


def _slice_updated(a):
    out = a.copy()
    out[2, 1:3] = a[0, :2]
    return out


def _scattered(a):
    out = np.zeros((4, 4), a.dtype)
    out[[1, 3]] = a
    return out


# name -> (onnxjob fn, NumPy reference, input value); each runs on every dtype above
SWEEP = {
    "reshape": (lambda a: flow.reshape(a, [4, -1]), lambda a: a.reshape(4, -1), V),
    "flatten": (lambda a: flow.flatten(a, 1), lambda a: a.reshape(2, 12), V),
    "squeeze": (lambda a: flow.squeeze(flow.expand_dims(a, 1)), lambda a: a, M),
    "transpose": (lambda a: flow.transpose(a, [2, 0, 1]), lambda a: a.transpose(2, 0, 1), V),
    "reverse": (lambda a: flow.reverse(a, -1), lambda a: a[..., ::-1], V),
    "slice_v2": (lambda a: flow.slice_v2(a, [(None, None, None), (2, 0, -1)]),
                 lambda a: a[:, 2:0:-1], V),
    "slice_update": (lambda a: flow.slice_update(a, flow.slice(a, [0, 0], [1, 2]),
                                                 [(2, 3, 1), (1, 3, 1)]), _slice_updated, M),
    "concat": (lambda a: flow.concat([a, a], axis=1), lambda a: np.concatenate([a, a], 1), M),
    "stack": (lambda a: flow.stack([a, a], 0), lambda a: np.stack([a, a]), M),
    "gather": (lambda a: flow.gather(a, [2, 0], axis=1), lambda a: a[:, [2, 0]], M),
    "gather_nd": (lambda a: flow.gather_nd(a, flow.constant(I32, flow.int32)),
                  lambda a: a[I32[:, 0], I32[:, 1]], M),
    "scatter_nd": (lambda a: flow.scatter_nd(np.array([[1], [3]]), a, [4, 4]), _scattered, M[:2]),
    "tensor_scatter_nd_update": (lambda a: flow.tensor_scatter_nd_update(a, I32[:, :1],
                                                                         _rows(a, 2)),
                                 lambda a: a[[1, 0, 2]], M),
    "tensor_scatter_nd_add": (lambda a: flow.tensor_scatter_nd_add(a, [[2]], _rows(a, 1)),
                              lambda a: a + np.pad(a[:1], [(2, 0), (0, 0)]), M),
    "dim_gather": (lambda a: flow.dim_gather(a, 1, flow.constant(DIM_IDX[:, :4], flow.int64)),
                   lambda a: np.take_along_axis(a, DIM_IDX[:, :4], 1), M),
    "expand": (lambda a: flow.expand(a, [2, 3, 4]), lambda a: np.broadcast_to(a, (2, 3, 4)), M),
    "broadcast_like": (lambda a: flow.broadcast_like(a, flow.concat([a, a, a], 0), [0]),
                       lambda a: np.broadcast_to(a, (3, 4)), M[:1]),
    "reshape_like": (lambda a: flow.reshape_like(a, flow.reshape(a, [4, 3])),
                     lambda a: a.reshape(4, 3), M),
    "where": (lambda a: flow.where(flow.cast(a, flow.int32), a, flow.zeros_like(a)),
              lambda a: np.where(a != 0, a, 0), M),
    "masked_fill": (lambda a: flow.masked_fill(a, flow.cast(a, flow.int8), 3),
                    lambda a: np.where(a != 0, 3, a), M),
    "argwhere": (lambda a: flow.argwhere(a, flow.int64), np.argwhere, M),  # dynamic
    "unique_values": (lambda a: unique_with_counts(flow.reshape(a, [12]))[0],
                      lambda a: np.array([0, 1, 2, 3, 4] + [0] * 7), M),
    "diag_vector": (lambda a: flow.diag(flow.slice(flow.reshape(a, [12]), [0], [3]), 1),
                    lambda a: np.diag(a.reshape(12)[:3], 1), M),
    "diag_matrix": (lambda a: flow.diag(a, -1), lambda a: np.diag(a, -1), M),
    "pad": (lambda a: flow.pad(a, [(1, 0), (0, 2)], 5), lambda a: np.pad(a, [(1, 0), (0, 2)],
                                                                         constant_values=5), M),
    "zero_pad2d": (lambda a: flow.zero_pad2d(a, 1),
                   lambda a: np.pad(a, [(0, 0)] * 2 + [(1, 1)] * 2), V[None]),
    "reflection_pad2d": (lambda a: flow.reflection_pad2d(a, [1, 2, 0, 1]),
                         lambda a: np.pad(a, [(0, 0)] * 2 + [(0, 1), (1, 2)], mode="reflect"),
                         V[None]),
    "replication_pad2d": (lambda a: flow.replication_pad2d(a, 2),
                          lambda a: np.pad(a, [(0, 0)] * 2 + [(2, 2)] * 2, mode="edge"), V[None]),
    "same_padding": (lambda a: flow.same_padding(a, "SAME_UPPER", "NCHW", [2, 2], [1, 1], [1, 1]),
                     lambda a: np.pad(a, [(0, 0)] * 2 + [(0, 1)] * 2), V[None]),
    "cast": (lambda a: flow.cast(flow.cast(a, flow.float64), a.dtype), lambda a: a, M),
    "identity_n": (lambda a: flow.identity_n([a])[0], lambda a: a, M),
    "one_hot": (lambda a: flow.one_hot(flow.cast(a, flow.int32), 5, dtype=a.dtype),
                lambda a: np.eye(5, dtype=a.dtype)[a.astype(int)], M),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", list(SWEEP))
def test_dtype_sweep_runs_or_refuses(name, dtype):
    """Every op on every dtype OneFlow allows: the NumPy value (none is refused)."""
    fn, reference, value = SWEEP[name]
    x = np.asarray(value).astype(dtype)
    if name == "argwhere":
        out = run(fn, x, ret=tp.ListNumpy)[1][0]
    else:
        _, out = run(fn, x)
    expected = reference(x)
    np.testing.assert_array_equal(out, expected)
    if name != "argwhere":  # int64 coordinates whatever the input
        assert out.dtype == np.dtype(dtype), (out.dtype, dtype)


@pytest.mark.parametrize("dtype", [flow.float32, flow.float64, flow.int8, flow.int32,
                                   flow.int64, flow.uint8])
def test_range_ones_zeros_dtypes(dtype):
    _, (r, o, z) = run(lambda: (flow.range(2, 9, 2, dtype=dtype), flow.ones([2], dtype),
                                flow.zeros([1], dtype)), ret=typing.Tuple[tp.Numpy, tp.Numpy,
                                                                          tp.Numpy])
    assert r.dtype == o.dtype == z.dtype == dtype.np_dtype
    np.testing.assert_array_equal(r, [2, 4, 6, 8])
    np.testing.assert_array_equal(o, [1, 1])


def test_bool_conditions_and_int8_masks_run():
    x = np.arange(6, dtype=np.int8).reshape(2, 3)
    _, out = run(lambda a: flow.where(flow.cast(a, flow.int64), a, flow.ones_like(a)), x)
    np.testing.assert_array_equal(out, np.where(x != 0, x, 1))
    _, out = run(lambda a: flow.argwhere(a > 3), x.astype(np.float32), ret=tp.ListNumpy)
    np.testing.assert_array_equal(out[0], [[1, 1], [1, 2]])


# -- errors -------------------------------------------------------------------------------

@pytest.mark.parametrize("fn,match", [
    (lambda a: flow.where(a, x=a), "both x and y"),
    (lambda a: flow.squeeze(a, [0]), "cannot squeeze"),
    (lambda a: flow.squeeze(a, [5]), "out of range"),
    (lambda a: flow.slice_v2(a, [(0, 2, 0)]), "step cannot be 0"),
    (lambda a: flow.slice_v2(a, [(7, 8, 1)]), "start 7"),
    (lambda a: flow.slice(a, [0], [1]), "begin must be"),
    (lambda a: flow.expand(a, [3, 5]), "cannot expand"),
    (lambda a: flow.expand(a, [4]), "fewer axes"),
    (lambda a: flow.broadcast_like(a, flow.zeros([3, 4, 2]), [0]), "does not fit"),
    (lambda a: flow.dim_gather(a, -1, flow.constant(0, flow.int32, [3, 4])), "dim -1"),
    (lambda a: flow.dim_gather(a, 0, flow.constant(0, flow.float32, [3, 4])), "int32 or int64"),
    (lambda a: flow.gather_nd(a, flow.constant(0, flow.float32, [2, 1])), "int32 or int64"),
    (lambda a: flow.reflection_pad2d(flow.reshape(a, [1, 1, 3, 4]), [4, 0, 0, 0]), "less than"),
    (lambda a: flow.pad(a, [(0, -1), (0, 0)]), ">= 0"),
    (lambda a: flow.pad(a, [1, 1]), "pairs"),
    (lambda a: flow.constant_pad2d(a, 1), "NCHW"),
    (lambda a: flow.same_padding(a, "SAME", "NCHW", [1], [1], [1]), "SAME_LOWER"),
    (lambda a: flow.diag(flow.reshape(a, [3, 2, 2])), "1-D or 2-D"),
    (lambda a: flow.diag(a, 5), "outside"),
    (lambda a: flow.range(5, 2), "larger than start"),
    (lambda a: flow.range(0.0, 2.0, 0.5), "delta 0 must be"),
    (lambda a: flow.argwhere(a, flow.float32), "int32 or int64"),
    (lambda a: unique_with_counts(a), "1-D"),
    (lambda a: flow.stack([a, flow.transpose(a)]), "same shape|must have shape"),
    (lambda a: flow.slice_update(a, a, [(0, 1, 1)]), "update must have shape"),
    (lambda a: flow.scatter_nd([[0]], a, [2, 2]), "updates must have shape"),
    (lambda a: flow.transpose(a, [0, 1], conjugate=True), "conjugate"),
    (lambda a: flow.random.bernoulli(flow.cast(a, flow.int32)), "float32 or float64"),
    (lambda a: flow.random.random_mask_like(a, 1.0), r"\[0, 1\)"),
    (lambda a: flow.random.coin_flip(3, probability=1.5), r"\[0, 1\]"),
    (lambda a: flow.sync_dynamic_resize(a, a), "1-element"),
])
def test_bad_arguments_raise_trace_error(fn, match):
    with pytest.raises(TraceError, match=match):
        run(fn, X34)


# -- signatures ---------------------------------------------------------------------------

ONEFLOW_SIGNATURES = {
    "argwhere": "condition, dtype=None, name=None",
    "broadcast_like": "x, like, broadcast_axes=None, name=None",
    "cast_to_static_shape": "x, name=None",
    "concat": "inputs=None, axis=0, max_dim_size=None, name=None, values=None",
    "constant_pad2d": "x, padding, constant_value=0, name=None",
    "constant_scalar": "value, dtype=None, name=None",
    "diag": "input, diagonal=0, name=None",
    "dim_gather": "input, dim, index, name=None",
    "dynamic_reshape": "x, shape, name=None",
    "elem_cnt": "inputs, dtype=None, name=None",
    "expand": "x, expand_size, name=None",
    "expand_dims": "input, axis, name=None",
    "flatten": "input, start_dim=0, end_dim=-1, name=None",
    "gather": "params, indices, validate_indices=None, axis=None, batch_dims=0, name=None",
    "gather_nd": "params, indices, name=None",
    "masked_fill": "x, mask, value, name=None",
    "nonzero": "a, name=None",
    "ones": "shape, dtype=None, name=None",
    "pad": "x, paddings, constant_value=0, name=None",
    "range": "start, limit=None, delta=1, dtype=None, name='range'",
    "reflection_pad2d": "x, padding, name=None",
    "replication_pad2d": "x, padding, name=None",
    "reshape": "x, shape, name=None",
    "reshape_like": "x, like, name=None",
    "reverse": "input, axis, name=None",
    "same_padding": "x, padding, data_format, kernel_size, strides, dilation_rate, name=None",
    "scatter_nd": "indices, updates, shape, name=None",
    "slice": "x, begin, size, name=None",
    "slice_update": "x, update, slice_tup_list, name=None",
    "slice_v2": "x, slice_tup_list, name=None",
    "squeeze": "input, axis=None, name=None",
    "stack": "inputs, axis=0, name=None",
    "sync_dynamic_resize": "inputs, size, name=None",
    "tensor_scatter_nd_add": "params, indices, updates, name=None",
    "tensor_scatter_nd_update": "params, indices, updates, name=None",
    "transpose": "a, perm=None, conjugate=False, batch_axis_non_change=False, name=None",
    "where": "condition, x=None, y=None, name=None",
    "zero_pad2d": "x, padding, name=None",
    "zeros": "shape, dtype=None, name=None",
    "random.bernoulli": "x, seed=None, dtype=None, name='Bernoulli'",
    "random.coin_flip": "batch_size=1, seed=None, probability=0.5, name='CoinFlip'",
    "random.CoinFlip": "batch_size=1, seed=None, probability=0.5, name='CoinFlip'",
    "random.shuffle": "value, seed=None, name=None",
    "random.generate_random_batch_permutation_indices": "value, seed=None, name=None",
    "random.gen_seed": "seed=None",
    "random.random_mask_like": "like, rate, seed=None, noise_shape=None, name=None",
}


@pytest.mark.parametrize("name", list(ONEFLOW_SIGNATURES))
def test_signature_matches_oneflow(name):
    fn = flow
    for part in name.split("."):
        fn = getattr(fn, part)
    assert str(inspect.signature(fn))[1:-1] == ONEFLOW_SIGNATURES[name]


# -- flow.random --------------------------------------------------------------------------

def _within(sample_mean, p, n, sigmas=4.5):
    return abs(sample_mean - p) <= sigmas * np.sqrt(p * (1 - p) / n)


def test_coin_flip_is_int8_bernoulli_and_fresh_every_run():
    job, first = run(lambda: flow.random.coin_flip(20000, probability=0.3))
    second = job()
    assert first.dtype == np.int8 and first.shape == (20000,)
    assert set(np.unique(first)) <= {0, 1}
    assert _within(first.mean(), 0.3, first.size) and _within(second.mean(), 0.3, second.size)
    assert not np.array_equal(first, second)
    assert flow.random.CoinFlip is flow.random.coin_flip


def test_two_draws_in_one_job_are_independent():
    _, (a, b) = run(lambda: (flow.random.coin_flip(256), flow.random.coin_flip(256)),
                    ret=typing.Tuple[tp.Numpy, tp.Numpy])
    assert not np.array_equal(a, b)


def test_seeded_draws_repeat_from_the_session_start():
    def first_two(seed):
        job, a = run(lambda: flow.random.coin_flip(64, seed=seed))
        return a, job()
    a1, a2 = first_two(7)
    b1, b2 = first_two(7)
    c1, _ = first_two(8)
    np.testing.assert_array_equal(a1, b1)
    np.testing.assert_array_equal(a2, b2)
    assert not np.array_equal(a1, a2) and not np.array_equal(a1, c1)
    unseeded = [run(lambda: flow.random.coin_flip(64))[1] for _ in range(2)]
    assert not np.array_equal(*unseeded), "fresh sessions must not repeat unseeded draws"


def test_bernoulli_means_per_probability():
    probs = np.repeat(np.array([[0.1], [0.5], [0.9]], np.float64), 8000, axis=1)
    job, out = run(flow.random.bernoulli, probs)
    assert out.dtype == np.float64
    for row, p in zip(out, (0.1, 0.5, 0.9)):
        assert _within(row.mean(), p, row.size)
    assert not np.array_equal(out, job(probs))
    _, out = run(lambda p: flow.random.bernoulli(p, dtype=flow.int8), probs[:, :10].astype(
        np.float32))
    assert out.dtype == np.int8


def test_random_mask_like_keeps_with_one_minus_rate():
    like = np.zeros((100, 120), np.float32)
    job, out = run(lambda a: flow.random.random_mask_like(a, 0.25), like)
    assert out.dtype == np.int8 and out.shape == like.shape
    assert _within(out.mean(), 0.75, out.size)
    assert not np.array_equal(out, job(like))


def test_permutations_are_uniform_and_shuffle_permutes_rows():
    x = np.arange(4, dtype=np.int32)
    job, perm = run(flow.random.generate_random_batch_permutation_indices, x)
    assert perm.dtype == np.int32
    firsts = [job(x)[0] for _ in range(400)]
    counts = np.bincount(firsts, minlength=4)
    assert all(_within(c / 400, 0.25, 400) for c in counts), counts
    rows = np.arange(30, dtype=np.float32).reshape(10, 3)
    job, out = run(flow.random.shuffle, rows)
    np.testing.assert_array_equal(np.sort(out, axis=0), rows)
    assert any(not np.array_equal(job(rows), out) for _ in range(3))


def test_in_graph_random_ops_are_not_constant_folded():
    """RandomUniform/Normal(Like) of constant inputs: fresh values on every run."""
    def draws():
        like = flow.constant(0.0, shape=[4000])
        return (op("RandomUniform", shape=[4000], dtype=1), op("RandomNormal", shape=[4000]),
                op("RandomUniformLike", like), op("RandomNormalLike", like, dtype=11))
    job, first = run(draws, ret=typing.Tuple[tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy])
    second = job()
    for a, b in zip(first, second):
        assert not np.array_equal(a, b)
    assert first[3].dtype == np.float64
    for uniform in (first[0], first[2]):
        assert abs(uniform.mean() - 0.5) < 4.5 * np.sqrt(1 / 12 / uniform.size)
    for normal_draw in (first[1], first[3]):
        assert abs(normal_draw.mean()) < 4.5 / np.sqrt(normal_draw.size)
        assert abs(normal_draw.std() - 1) < 0.05


def test_random_ops_stay_random_in_train_jobs():
    def body(x):
        w = flow.get_variable("w", shape=(8,), initializer=flow.ones_initializer())
        mask = flow.cast(flow.random.random_mask_like(w, 0.5), flow.float32)
        loss = flow.math.reduce_sum(w * mask * x)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0]),
                           momentum=0).minimize(loss)
        return mask
    x = np.ones(8, np.float32)
    job, first = run(body, x, train=True)
    assert any(not np.array_equal(first, job(x)) for _ in range(3))


def test_gen_seed():
    assert flow.random.gen_seed(5) == (5, True)
    seed, has_seed = flow.random.gen_seed()
    assert has_seed and isinstance(seed, int) and seed != flow.random.gen_seed()[0]

"""Eager tensors (flow.Tensor, flow.nn.Parameter, flow.autograd, flow.experimental.optim):
values and gradients against PyTorch, per op and for a trained MLP; the optimizers against
OneFlow's update kernels written in NumPy; the schedulers against their formulas and
PyTorch's; the tape's rules (accumulation, retain_graph, no_grad, errors)."""
import math

import numpy as np
import pytest
import torch

import onnxjob as flow
from onnxjob.eager import tape as eager_tape

optim = flow.experimental.optim
RNG = np.random.default_rng(7)


def _pair(shape, positive=False):
    """A leaf requiring gradients and its PyTorch twin."""
    array = RNG.standard_normal(shape).astype(np.float32)
    if positive:
        array = np.abs(array) + 0.5
    return (flow.nn.Parameter(flow.Tensor(array)),
            torch.tensor(array, requires_grad=True))


# (name, onnxjob function, PyTorch function, input shapes, positive inputs)
OPS = [
    ("relu", lambda a: flow.math.relu(a), torch.relu, [(3, 4)], False),
    ("sigmoid", lambda a: flow.math.sigmoid(a), torch.sigmoid, [(3, 4)], False),
    ("tanh", lambda a: a.tanh(), torch.tanh, [(3, 4)], False),
    ("exp", lambda a: a.exp(), torch.exp, [(3, 4)], False),
    ("log", lambda a: flow.math.log(a), torch.log, [(3, 4)], True),
    ("sqrt", lambda a: a.sqrt(), torch.sqrt, [(3, 4)], True),
    ("matmul", lambda a, b: flow.matmul(a, b), torch.matmul, [(3, 4), (4, 5)], False),
    ("matmul operator", lambda a, b: a @ b, torch.matmul, [(2, 3), (3, 2)], False),
    ("broadcast add mul", lambda a, b: (a + b) * b - 2 / (b * b + 1),
     lambda a, b: (a + b) * b - 2 / (b * b + 1), [(3, 4), (4,)], False),
    ("sum axis", lambda a: flow.math.reduce_sum(a, axis=1), lambda a: a.sum(1), [(3, 4)],
     False),
    ("mean keepdim", lambda a: a.mean(dim=0, keepdim=True),
     lambda a: a.mean(0, keepdim=True), [(3, 4)], False),
    ("reshape transpose", lambda a: a.reshape(4, 3).transpose(0, 1) * 3,
     lambda a: a.reshape(4, 3).transpose(0, 1) * 3, [(3, 4)], False),
    ("softmax", lambda a: flow.nn.softmax(a, axis=-1) * a,
     lambda a: torch.softmax(a, -1) * a, [(3, 4)], False),
    ("pow", lambda a: a ** 3, lambda a: a ** 3, [(3, 4)], False),
    ("conv2d", lambda x, w: flow.nn.conv2d(x, w, strides=1, padding="SAME"),
     lambda x, w: torch.nn.functional.conv2d(x, w, padding=1), [(2, 3, 5, 5), (4, 3, 3, 3)],
     False),
    ("tensor methods", lambda a: a.unsqueeze(1).squeeze(1).clamp(-0.5, 0.5).mul(2).sub(1),
     lambda a: a.unsqueeze(1).squeeze(1).clamp(-0.5, 0.5).mul(2).sub(1), [(3, 4)], False),
    ("max_pool2d", lambda x: flow.nn.max_pool2d(x, ksize=2, strides=2, padding="VALID"),
     lambda x: torch.nn.functional.max_pool2d(x, 2, 2), [(2, 3, 4, 4)], False),
]


@pytest.mark.parametrize("name,ours,theirs,shapes,positive", OPS, ids=[o[0] for o in OPS])
def test_an_op_on_eager_tensors_computes_and_differentiates_as_pytorch(
        name, ours, theirs, shapes, positive):
    pairs = [_pair(s, positive) for s in shapes]
    out = ours(*[p for p, _ in pairs])
    expected = theirs(*[t for _, t in pairs])
    np.testing.assert_allclose(out.numpy(), expected.detach().numpy(), rtol=1e-5, atol=1e-6)
    seed = RNG.standard_normal(expected.shape).astype(np.float32)
    out.backward(flow.Tensor(seed))
    expected.backward(torch.tensor(seed))
    for p, t in pairs:
        np.testing.assert_allclose(p.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_a_gradient_matches_finite_differences():
    """d/dx sum(tanh(x W) ^ 2) against central differences in float64."""
    x = RNG.standard_normal((2, 3))
    w = flow.Tensor(RNG.standard_normal((3, 2)), dtype=flow.float64)

    def f(array):
        return (flow.Tensor(array, dtype=flow.float64) @ w).tanh().square().sum()
    leaf = flow.nn.Parameter(flow.Tensor(x, dtype=flow.float64))
    ((leaf @ w).tanh().square().sum()).backward()
    numeric = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        step = np.zeros_like(x)
        step[i] = 1e-6
        numeric[i] = (f(x + step).item() - f(x - step).item()) / 2e-6
    np.testing.assert_allclose(leaf.grad.numpy(), numeric, rtol=1e-6, atol=1e-8)


def _mlp(params, x, labels):
    w1, w2 = params
    return flow.math.reduce_mean(flow.nn.sparse_softmax_cross_entropy_with_logits(
        labels, flow.matmul(flow.math.relu(flow.matmul(x, w1)), w2)))


def test_an_mlp_trained_with_sgd_and_momentum_follows_its_pytorch_twin():
    """Five SGD steps with momentum at a constant lr (OneFlow's momentum keeps lr * g in
    its buffer, PyTorch keeps g: the same steps while lr stays)."""
    x = RNG.standard_normal((16, 6)).astype(np.float32)
    labels = RNG.integers(0, 3, 16).astype(np.int32)
    arrays = [RNG.standard_normal((6, 8)).astype(np.float32) * 0.5,
              RNG.standard_normal((8, 3)).astype(np.float32) * 0.5]
    params = [flow.nn.Parameter(flow.Tensor(a)) for a in arrays]
    twins = [torch.tensor(a, requires_grad=True) for a in arrays]
    opt = optim.SGD(params, lr=0.1, momentum=0.9)
    topt = torch.optim.SGD(twins, lr=0.1, momentum=0.9)
    ours, theirs = [], []
    for _ in range(5):
        loss = _mlp(params, flow.Tensor(x), flow.Tensor(labels, dtype=flow.int32))
        opt.zero_grad()
        loss.backward()
        opt.step()
        ours.append(loss.item())
        tloss = torch.nn.functional.cross_entropy(
            torch.relu(torch.tensor(x) @ twins[0]) @ twins[1], torch.tensor(labels).long())
        topt.zero_grad()
        tloss.backward()
        topt.step()
        theirs.append(tloss.item())
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)
    assert ours[-1] < ours[0]
    for p, t in zip(params, twins):
        np.testing.assert_allclose(p.numpy(), t.detach().numpy(), rtol=1e-4, atol=1e-6)


def _oneflow_update(kind, w, g, state, lr, **o):
    """OneFlow 0.5's eager optimizers' kernels (model_update_kernel_util.h) in NumPy,
    float32, one step: g is scaled by `scale` (+ Adam's L2), then the kernel runs."""
    f = np.float32
    g = g * f(o.get("scale", 1.0))
    if kind == "adam":
        g = g + f(o.get("weight_decay", 0.0)) * w
    if kind in ("adam", "adamw"):
        b1, b2 = (f(b) for b in o.get("betas", (0.9, 0.999)))
        state["m"] = b1 * state["m"] + (f(1) - b1) * g
        state["v"] = b2 * state["v"] + (f(1) - b2) * g * g
        step = f(lr) * state["m"] / (np.sqrt(state["v"]) + f(o.get("eps", 1e-8)))
        decay = f(lr) * f(o.get("weight_decay", 0.0)) * w if kind == "adamw" else 0
        return w - step - decay             # (the decay of the weight before the step)
    alpha, eps = f(o.get("alpha", 0.99)), f(o.get("eps", 1e-8))
    state["ms"] = (f(1) - alpha) * g * g + alpha * state["ms"]
    denom = state["ms"]
    if o.get("centered"):
        state["mg"] = (f(1) - alpha) * g + alpha * state["mg"]
        denom = state["ms"] - state["mg"] * state["mg"]
    return w - f(lr) * g / np.sqrt(denom + eps)


@pytest.mark.parametrize("kind,cls,options", [
    ("adam", optim.Adam, dict(betas=(0.8, 0.99), weight_decay=0.1, scale=2.0)),
    ("adamw", optim.AdamW, dict(weight_decay=0.05)),
    ("rmsprop", optim.RMSprop, dict(alpha=0.9, eps=1e-6)),
    ("rmsprop", optim.RMSprop, dict(centered=True)),
])
def test_the_adaptive_optimizers_take_oneflows_kernel_steps(kind, cls, options):
    w0 = RNG.standard_normal((4, 3)).astype(np.float32)
    param = flow.nn.Parameter(flow.Tensor(w0))
    opt = cls([param], lr=0.01, **options)
    expected = w0.copy()
    state = {k: np.zeros_like(w0) for k in ("m", "v", "ms", "mg")}
    for _ in range(3):
        loss = (param * param * param).sum()
        opt.zero_grad()
        loss.backward()
        grad = param.grad.numpy()
        np.testing.assert_allclose(grad, 3 * expected ** 2, rtol=1e-5)
        opt.step()
        expected = _oneflow_update(kind, expected, grad, state, 0.01, **options)
        np.testing.assert_allclose(param.numpy(), expected, rtol=1e-5, atol=1e-7)


def test_parameter_groups_take_their_own_options_and_schedulers_set_each_lr():
    a, b = (flow.nn.Parameter(flow.Tensor(np.ones(2, np.float32))) for _ in range(2))
    opt = optim.SGD([{"params": [a]}, {"params": [b], "lr": 1.0}], lr=0.1)
    (a.sum() + b.sum()).backward()
    opt.step()
    np.testing.assert_allclose(a.numpy(), [0.9, 0.9], rtol=1e-6)
    np.testing.assert_allclose(b.numpy(), [0.0, 0.0], atol=1e-7)
    scheduler = optim.lr_scheduler.LambdaLR(opt, [lambda s: 1.0, lambda s: 0.5 ** s])
    scheduler.step()
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.5]


def _lrs(ours, theirs, steps=8):
    """The lr of each step from an onnxjob and a PyTorch scheduler over one parameter."""
    param = flow.nn.Parameter(flow.Tensor(np.zeros(1, np.float32)))
    twin = torch.zeros(1, requires_grad=True)
    opt, topt = optim.SGD([param], lr=0.5), torch.optim.SGD([twin], lr=0.5)
    s, t = ours(opt), theirs(topt)
    got, want = [], []
    for _ in range(steps):
        got.append(opt.param_groups[0]["lr"])
        want.append(topt.param_groups[0]["lr"])
        topt.step()
        s.step()
        t.step()
    return got, want


def test_step_and_lambda_schedulers_give_pytorchs_learning_rates():
    got, want = _lrs(lambda o: optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5),
                     lambda o: torch.optim.lr_scheduler.StepLR(o, 3, 0.5))
    np.testing.assert_allclose(got, want)
    got, want = _lrs(lambda o: optim.lr_scheduler.LambdaLR(o, lambda s: 1 / (1 + s)),
                     lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1 / (1 + s)))
    np.testing.assert_allclose(got, want)


def test_cosine_decay_follows_the_cosine_then_stays_at_alpha():
    got, want = _lrs(lambda o: optim.lr_scheduler.CosineDecayLR(o, steps=5),
                     lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=5))
    np.testing.assert_allclose(got[:5], want[:5], atol=1e-12)
    assert got[5:] == [0.0] * 3           # OneFlow stays at alpha; PyTorch's goes back up
    got, _ = _lrs(lambda o: optim.lr_scheduler.CosineDecayLR(o, steps=4, alpha=0.2),
                  lambda o: torch.optim.lr_scheduler.StepLR(o, 100))
    expected = [0.5 * ((1 - 0.2) * 0.5 * (1 + math.cos(math.pi * s / 4)) + 0.2)
                for s in range(4)] + [0.5 * 0.2] * 4
    np.testing.assert_allclose(got, expected)


def test_backward_accumulates_and_grad_reads_any_tensor_without_accumulating():
    x = flow.nn.Parameter(flow.Tensor([1.0, 2.0, 3.0]))
    y = x * x
    z = y.sum()
    (dz_dy, dz_dx) = flow.autograd.grad(z, [y, x], retain_graph=True)
    np.testing.assert_allclose(dz_dy.numpy(), [1, 1, 1])
    np.testing.assert_allclose(dz_dx.numpy(), [2, 4, 6])
    assert x.grad is None
    z.backward()
    (x * 3).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [5, 7, 9])     # 2x + 3, accumulated


def test_a_second_backward_through_an_ended_graph_is_refused_unless_retained():
    x = flow.nn.Parameter(flow.Tensor([1.0, 2.0]))
    y = x * x
    y.sum().backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        (y * 2).sum().backward()
    x.grad = None
    y = x * x
    y.sum().backward(retain_graph=True)
    (y * 2).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [6, 12])       # 2x + 4x


def test_no_grad_records_nothing_and_errors_read_as_pytorchs():
    x = flow.nn.Parameter(flow.Tensor(np.ones((2, 2), np.float32)))
    with flow.no_grad():
        y = flow.math.relu(x) * 2
    assert not y.requires_grad and y.is_leaf
    with pytest.raises(RuntimeError, match="does not require grad"):
        y.sum().backward()
    with pytest.raises(RuntimeError, match="only for scalar outputs"):
        (x * 2).backward()
    assert flow.autograd.no_grad is flow.no_grad


def test_inference_without_gradients_keeps_no_tape_alive():
    """Ops on tensors that need no gradient run on scratch tapes: nothing accumulates."""
    w = flow.Tensor(np.ones((4, 4), np.float32))
    x = flow.Tensor(np.ones((1, 4), np.float32))
    for _ in range(3):
        x = flow.math.tanh(flow.matmul(x, w))
    assert x.is_leaf and not x.requires_grad
    np.testing.assert_allclose(x.numpy(), np.tanh(4 * np.tanh(4 * np.tanh(4.0))) *
                               np.ones((1, 4)), rtol=1e-6)


def test_tensors_are_made_as_oneflows_constructor_makes_them():
    assert flow.Tensor(2, 3).shape == (2, 3) and not flow.Tensor(2, 3).numpy().any()
    assert flow.Tensor(2, 3).dtype is flow.float32
    assert flow.Tensor(np.arange(3)).dtype is flow.float32       # float32 unless told
    assert flow.Tensor([1, 2], dtype=flow.int32).dtype is flow.int32
    p = flow.nn.Parameter(flow.Tensor([1.0, 2.0]))
    assert p.requires_grad and p.is_leaf and isinstance(p, flow.Tensor)
    assert "oneflow.float32" in repr(p)
    assert p.long().dtype is flow.int64 and p.double().dtype is flow.float64
    assert flow.Tensor([[1.0, 3.0], [4.0, 2.0]]).argmax(dim=1).tolist() == [1, 0]
    flow.InitEagerGlobalSession()          # OneFlow's eager session: none to start


def test_the_tape_of_a_training_loop_does_not_outlive_its_step():
    w = flow.nn.Parameter(flow.Tensor(np.ones(3, np.float32)))
    opt = optim.SGD([w], lr=0.1)
    tapes = set()
    for _ in range(3):
        loss = (w * w).sum()
        tapes.add(id(eager_tape.current_tape()))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert len(tapes) == 3                 # each backward ended its step's tape
    np.testing.assert_allclose(w.numpy(), 0.8 ** 3 * np.ones(3), rtol=1e-6)


@pytest.mark.parametrize("key", [1, -1, (0, 2), (slice(None), 1),
                                 (slice(1, None, 2), Ellipsis, 3),
                                 (None, 0, slice(None, None, -1)), (Ellipsis, None),
                                 (slice(None), slice(3, 0, -2), None, 2)])
def test_basic_indexing_reads_and_differentiates_as_numpy_indexes(key):
    a = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    p = flow.nn.Parameter(flow.Tensor(a))
    out = p[key]
    np.testing.assert_array_equal(out.numpy(), a[key])
    seed = RNG.standard_normal(a[key].shape).astype(np.float32)
    out.backward(flow.Tensor(seed))
    expected = np.zeros_like(a)
    expected[key] += seed
    np.testing.assert_array_equal(p.grad.numpy(), expected)
    with pytest.raises(IndexError, match="out of bounds"):
        p[3]


def test_what_eager_tensors_cannot_do_names_the_line():
    """Job variables (flow.layers.dense makes one) and APIs that are no op refuse eager
    tensors with onnxjob's errors at the caller's line, not a raw error from inside."""
    x = flow.Tensor(np.ones((2, 3), np.float32))
    with pytest.raises(flow.errors.UnsupportedAPIError,
                       match=r"test_eager_tensors.py:\d+: .*flow.nn.Parameter"):
        flow.layers.dense(x, 4)
    with pytest.raises(flow.errors.TraceError,
                       match=r"test_eager_tensors.py:\d+: flow.global_function cannot take"):
        flow.global_function(x)


def test_a_tensor_of_a_shape_is_drawn_by_its_initializer_and_the_process_seed():
    flow.manual_seed(5)
    a = flow.Tensor(200, data_initializer=flow.random_normal_initializer(stddev=2.0))
    assert abs(a.numpy().std() - 2.0) < 0.4
    b = flow.Tensor(200, data_initializer=flow.random_normal_initializer(stddev=2.0))
    assert not np.array_equal(a.numpy(), b.numpy())      # the stream goes on
    with pytest.raises(TypeError):
        flow.Tensor(2, no_such_option=1)

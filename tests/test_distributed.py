"""Data-parallel training over torch.distributed (gloo, CPU): two ranks launched with
`python -m onnxjob run --nproc 2` end with the weights of one process trained on the whole
batch; a failing rank stops the run; the checkpoint rank 0 writes loads in one process."""
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest

import onnxjob as flow
from zoo import cnns_dir

torch = pytest.importorskip("torch", reason="data-parallel training needs torch.distributed "
                                            "(pip install 'onnxjob[distributed]')")
if not torch.distributed.is_available():
    pytest.skip("this PyTorch build has no torch.distributed", allow_module_level=True)

NETS = {
    "mlp": """
        flat = flow.reshape(images, [images.shape[0], -1])
        hidden = flow.layers.dense(flat, 32, activation=flow.nn.relu, kernel_initializer=init,
                                   name="hidden")
        logits = flow.layers.dense(hidden, 10, kernel_initializer=init, name="output")""",
    "lenet": """
        conv = flow.layers.conv2d(images, 8, 5, padding="SAME", activation=flow.nn.relu,
                                  kernel_initializer=init, name="conv1")
        pool = flow.nn.max_pool2d(conv, ksize=2, strides=2, padding="SAME")
        flat = flow.reshape(pool, [pool.shape[0], -1])
        logits = flow.layers.dense(flat, 10, kernel_initializer=init, name="dense")""",
    # batch norm over the whole batch: the ranks' statistics are synchronized
    "conv_bn": """
        conv = flow.layers.conv2d(images, 8, 3, padding="SAME", kernel_initializer=init,
                                  use_bias=False, name="conv1")
        normed = flow.layers.batch_normalization(conv, axis=1, momentum=0.9, name="bn1")
        pool = flow.nn.max_pool2d(flow.nn.relu(normed), ksize=2, strides=2, padding="SAME")
        flat = flow.reshape(pool, [pool.shape[0], -1])
        dense = flow.layers.dense(flat, 16, kernel_initializer=init, name="dense")
        logits = flow.layers.batch_normalization(dense, axis=1, name="bn2")""",
    # OneFlow-Benchmark's ResNet50 builder, unchanged (53 batch norms; its 7x7 average pool
    # needs 224x224 images), at batch 4
    "resnet50": """
        logits = zoo.model_builder("resnet50")(images, zoo.model_args())""",
}
# programs that state the batch as a number: a reshape to (BATCH, -1), a slice over the
# batch axis, a loss averaged by the constant BATCH plus a regularizer on a weight (a
# whole value added to one summed over the rows); tanh, not ReLU: over 3 ranks with 8
# threads a batch-normalized value near 0 rounded to the other side of ReLU's kink in the
# third step, and its channel's weight gradient moved by 0.14 (measured; not what is tested)
NETS["batch_shapes"] = """
        conv = flow.layers.conv2d(images, 4, 3, padding="SAME", kernel_initializer=init,
                                  use_bias=False, name="conv1")
        normed = flow.layers.batch_normalization(conv, axis=1, momentum=0.9, name="bn1")
        flat = flow.reshape(flow.math.tanh(normed), (BATCH, -1))
        flat = flow.slice(flat, [None, 0], [None, 3000])
        logits = flow.layers.dense(flat, 10, kernel_initializer=init, name="dense")"""
# an embedding looked up by each example's id (its label + 3: ids 3..12 of a 12-row table,
# 12 outside it: a zero row, as OneFlow's gather): each rank adds the gradient rows of its
# own lookups into the table's gradient (graph/split_rules.py scatter_add_of_rows)
NETS["embedding"] = """
        flat = flow.reshape(images, [images.shape[0], -1])
        table = flow.get_variable("table", (12, 10), initializer=init)
        logits = flow.layers.dense(flat, 10, kernel_initializer=init, name="dense") + \\
            flow.gather(table, labels + 3)"""
LOSSES = {"batch_shapes": """
    w = flow.get_variable("dense-weight", shape=(10, 3000), initializer=init)
    loss = flow.math.reduce_sum(
        flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)) / BATCH
    loss = loss + 0.01 * flow.math.reduce_sum(w * w)"""}
SHAPES = {"resnet50": (4, 3, 224, 224), "batch_shapes": (6, 1, 28, 28)}   # (batch, C, H, W)
LEARNING_RATES = {"resnet50": 0.01, "batch_shapes": 0.01}
# ResNet50 compares after one step: in the second, a ReLU input that rounds to the other
# side of 0 in one of the runs moves its channel's gradients (by < 1e-5 absolute, measured)
STEPS = {"resnet50": 1}


def write_script(tmp_path, net, fail_rank=None, mean_loss=False, stall_rank=None, config="",
                 steps=None, optimizer="flow.optimizer.SGD({schedule}, momentum=0.9)"):
    body = textwrap.indent(textwrap.dedent(NETS[net]).strip(), "    ")
    script = tmp_path / f"{net}_train.py"
    reduce = "flow.math.reduce_mean" if mean_loss else ""
    shape = SHAPES.get(net, (8, 1, 28, 28))
    schedule = f"flow.optimizer.PiecewiseConstantScheduler([], [{LEARNING_RATES.get(net, 0.1)}])"
    loss = LOSSES.get(net, f"""
    loss = {reduce}(flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))""")
    script.write_text(f"""import json, os, sys, time
import numpy as np
import onnxjob as flow
import onnxjob.typing as tp
sys.path.insert(0, {os.path.dirname(__file__)!r})
import zoo

BATCH = {shape[0]}
config = flow.function_config()
{config}

@flow.global_function(type="train", function_config=config)
def train_job(images: tp.Numpy.Placeholder({shape!r}, dtype=flow.float),
              labels: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
    init = flow.truncated_normal(0.1)
{body}
{loss}
    {optimizer.format(schedule=schedule)}.minimize(loss)
    return loss

if len(sys.argv) > 2:           # load a checkpoint, save the variables as .npz
    flow.load_variables(flow.checkpoint.get(sys.argv[2]))
    np.savez(sys.argv[3], **{{k: v.numpy() for k, v in flow.get_all_variables().items()}})
    sys.exit(0)
rank = int(os.environ.get("RANK", "0"))
flow.config.seed(5 + rank)      # the ranks draw different values: rank 0's are broadcast
rng = np.random.default_rng(0)
losses = []
for step in range({steps or STEPS.get(net, 3)}):
    x = rng.random({shape!r}, dtype=np.float32)
    y = rng.integers(0, 10, BATCH).astype(np.int32)
    losses.append(train_job(x, y).tolist())
    if rank == {fail_rank!r}:
        raise RuntimeError("rank {fail_rank} fails on purpose")
    if rank == {stall_rank!r}:
        time.sleep(120)         # never reaches the next step's all-reduce
flow.checkpoint.save(sys.argv[1])
print(f"rank {{rank}} of {{os.environ.get('WORLD_SIZE', '1')}} done", file=sys.stderr)
if rank == 0:                   # what it trained, for tests that need no checkpoint load
    np.savez(sys.argv[1] + "-trained.npz",
             **{{k: v.numpy() for k, v in flow.get_all_variables().items()}})
    print(json.dumps(losses))
""")
    return script


def run(script, nproc, *args, timeout=300, env=None):
    command = [sys.executable, "-m", "onnxjob", "run"] + (
        ["--nproc", str(nproc)] if nproc > 1 else [])
    environ = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    return subprocess.run(command + [str(script)] + [str(a) for a in args], capture_output=True,
                          text=True, timeout=timeout,
                          env={**environ, "ONNXJOB_DEVICE": "cpu", **(env or {})})


# the runs run_once shares, their checkpoints in a folder that outlives the test that made
# them (a passed test's tmp_path is removed: pyproject's tmp_path_retention_policy)
_RUNS = {}
_RUNS_FOLDER = tempfile.TemporaryDirectory(prefix="onnxjob-test-runs-")


def run_once(script, nproc, env=None):
    """(result, checkpoint folder) of `run(script, nproc, checkpoint, env=env)`, made once
    in a test session for the same script text, number of ranks and environment. The runs
    are deterministic, so tests that check other things against the same reference run
    (one process, or two ranks on the NumPy path) share it."""
    key = (script.read_text(), nproc, tuple(sorted((env or {}).items())))
    if key not in _RUNS:
        checkpoint = pathlib.Path(_RUNS_FOLDER.name) / f"run{len(_RUNS)}"
        _RUNS[key] = run(script, nproc, checkpoint, env=env), checkpoint
    return _RUNS[key]


def loaded(script, checkpoint):
    """The variables of `checkpoint` as a single process loads them."""
    saved = checkpoint.parent / f"{checkpoint.name}.npz"
    result = run(script, 1, checkpoint.parent / "unused", checkpoint, saved)
    assert result.returncode == 0, result.stderr
    with np.load(saved) as variables:
        return dict(variables)


def trained(checkpoint):
    """The variables rank 0 held when it wrote `checkpoint` (a write_script script saves
    them beside it): the training's result, without a process that loads the checkpoint."""
    with np.load(f"{checkpoint}-trained.npz") as variables:
        return dict(variables)


# (per-example losses gathered: LeNet's case; the MLP's mean loss)
@pytest.mark.parametrize("net,mean_loss", [("lenet", False), ("mlp", True), ("conv_bn", True),
                                           ("resnet50", True)])
def test_two_ranks_train_as_one_process_on_the_whole_batch(tmp_path, net, mean_loss):
    """Per-example losses come back gathered (the whole batch's), a mean loss averaged;
    batch norm normalizes with the whole batch's statistics."""
    if net == "resnet50":
        cnns_dir()      # skips without OneFlow-Benchmark's files
    script = write_script(tmp_path, net, mean_loss=mean_loss)
    two, two_checkpoint = run_once(script, 2)
    assert two.returncode == 0, two.stderr
    one, one_checkpoint = run_once(script, 1)
    assert one.returncode == 0, one.stderr
    # the whole batch's per-example losses, gathered in rank order
    np.testing.assert_allclose(json.loads(two.stdout), json.loads(one.stdout), rtol=1e-5)
    # rank 0's checkpoint loads in a single process, equal to the single-process weights
    two_ranks, one_rank = loaded(script, two_checkpoint), trained(one_checkpoint)
    assert sorted(two_ranks) == sorted(one_rank)
    # (sums over the rows in another order: conv_bn's weights 1.7e-6 apart on 16 cores)
    for name, value in one_rank.items():
        np.testing.assert_allclose(two_ranks[name], value, rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("nproc", [2, 3])
def test_a_program_that_states_its_batch_trains_as_one_process(tmp_path, nproc):
    """Traced at the whole batch as on one device, then split for the ranks: the
    reshape to (BATCH, -1), the slice over the batch and the loss divided by BATCH hold."""
    script = write_script(tmp_path, "batch_shapes")
    assert_trains_as_one_process(script, run(script, nproc, tmp_path / "many"), tmp_path)


def test_ranks_started_by_torchrun_train_as_one_process(tmp_path):
    """torchrun sets the environment onnxjob's launcher sets (RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT, LOCAL_RANK): the same unchanged program trains as one process."""
    script = write_script(tmp_path, "batch_shapes")
    environ = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    many = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(script), str(tmp_path / "many")],
        capture_output=True, text=True, timeout=300, env={**environ, "ONNXJOB_DEVICE": "cpu"})
    assert "rank 1 of 2 done" in many.stderr, many.stderr[-3000:]
    assert_trains_as_one_process(script, many, tmp_path)


def assert_trains_as_one_process(script, many, tmp_path):
    """`many` (a finished run of `script` as ranks, checkpoint in tmp_path / "many") ends
    with the losses and weights of one process on the whole batch."""
    assert many.returncode == 0, many.stderr
    one, one_checkpoint = run_once(script, 1)
    assert one.returncode == 0, one.stderr
    np.testing.assert_allclose(json.loads(many.stdout), json.loads(one.stdout), rtol=1e-5)
    ranks, one_rank = trained(tmp_path / "many"), trained(one_checkpoint)
    for name, value in one_rank.items():     # (atol: as in the test above)
        np.testing.assert_allclose(ranks[name], value, rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("net,config,rtol,atol", [
    # a bucket per few gradients: their all-reduces start while later stages compute
    ("conv_bn", "config.all_reduce_group_min_mbyte(0.0001)", 1e-5, 1e-6),
    # float32 gradients sent as float16: float16's precision (each rank's partial sum
    # rounded; batch norm's gradients cancel across the ranks, so the MLP here)
    ("mlp", "config.all_reduce_fp16(True)", 2e-3, 1e-4)])
def test_gradient_buckets_and_half_all_reduce(tmp_path, net, config, rtol, atol):
    script = write_script(tmp_path, net, mean_loss=True, config=config)
    two, two_checkpoint = run_once(script, 2)
    assert two.returncode == 0, two.stderr
    one, one_checkpoint = run_once(script, 1)
    assert one.returncode == 0, one.stderr
    two_ranks, one_rank = trained(two_checkpoint), trained(one_checkpoint)
    for name, value in one_rank.items():
        np.testing.assert_allclose(two_ranks[name], value, rtol=rtol, atol=atol, err_msg=name)
    if rtol > 1e-5:     # the flag changes the numbers: not silently ignored
        assert max(np.max(np.abs(two_ranks[n] - v)) for n, v in one_rank.items()) > 1e-6


@pytest.mark.parametrize("optimizer", ["SGD", "LazyAdam"])
def test_an_embedding_trains_over_two_ranks_as_one_process(tmp_path, optimizer):
    """A table looked up by the examples' ids (one outside it) trains over two ranks as one
    process: each rank adds its lookups' gradient rows into the table's gradient; under
    LazyAdam (row-sparse: indexed_slices_optimizer_conf) each rank updates the rows any
    rank looked up (the indices gathered for the update; a row looked up in one step and
    not the next would move in a dense update)."""
    chosen = {"SGD": "flow.optimizer.SGD({schedule}, momentum=0.9)",
              "LazyAdam": "flow.optimizer.LazyAdam({schedule})"}[optimizer]
    rows = ("config.indexed_slices_optimizer_conf("
            "dict(include_op_names=dict(op_name=['table'])))")
    script = write_script(tmp_path, "embedding", mean_loss=True, optimizer=chosen,
                          config=rows if optimizer == "LazyAdam" else "")
    assert_trains_as_one_process(script, run(script, 2, tmp_path / "many"), tmp_path)


def test_gradient_accumulation_over_two_ranks_trains_as_one_process(tmp_path):
    """function_config.train.num_gradient_accumulation_steps(2): each rank runs its share
    of each micro-batch, the gradients are added on the ranks and reduced once; the losses
    (per micro-batch, packed) and weights are those of one process accumulating over the
    whole batch, and batch norm's micro-batch statistics make them differ from one step on
    the whole batch (without batch norm they equal it: test_gradient_accumulation.py)."""
    # (two steps: in the third, a batch-normalized value on micro-batches of 4 rows rounds
    # to the other side of ReLU's kink in one of the runs and its channel's weight moves by
    # 1e-3; measured, and not what is tested)
    accumulating = "config.train.num_gradient_accumulation_steps(2)"
    script = write_script(tmp_path, "conv_bn", mean_loss=True, config=accumulating, steps=2)
    assert_trains_as_one_process(script, run(script, 2, tmp_path / "many"), tmp_path)
    one, _ = run_once(script, 1)
    assert np.shape(json.loads(one.stdout)) == (2, 2)   # a mean loss per micro-batch
    whole, whole_checkpoint = run_once(write_script(tmp_path, "conv_bn", mean_loss=True,
                                                    steps=2), 1)
    assert whole.returncode == 0, whole.stderr
    accumulated = trained(tmp_path / "many")
    assert max(np.max(np.abs(accumulated[n] - v))
               for n, v in trained(whole_checkpoint).items()) > 1e-4


def test_batch_norm_with_each_ranks_own_statistics(tmp_path):
    """ONNXJOB_SYNC_BATCH_NORM=0 normalizes each rank's rows with their own statistics
    (DDP without SyncBatchNorm): it trains, and not as the synchronized run does."""
    script = write_script(tmp_path, "conv_bn", mean_loss=True)
    local = run(script, 2, tmp_path / "local", env={"ONNXJOB_SYNC_BATCH_NORM": "0"})
    assert local.returncode == 0, local.stderr
    synced, _ = run_once(script, 2)
    assert synced.returncode == 0, synced.stderr
    local_losses, synced_losses = json.loads(local.stdout), json.loads(synced.stdout)
    assert np.isfinite(local_losses).all()
    assert local_losses[0] != pytest.approx(synced_losses[0], rel=1e-4)


def test_a_failing_rank_stops_the_run(tmp_path):
    script = write_script(tmp_path, "mlp", fail_rank=1)
    # a rank left waiting in a collective would hang the run: the 60 s limit catches it
    result = run(script, 2, tmp_path / "ck", timeout=60)
    assert result.returncode != 0
    assert "rank 1 fails on purpose" in result.stderr
    assert "rank 1 of 2 exited with status" in result.stderr


KILLED_RANK_SCRIPT = """import os, signal, sys
import numpy as np
import onnxjob as flow
import onnxjob.typing as tp

@flow.global_function(type="train")
def train_job(x: tp.Numpy.Placeholder((8, 4)),
              y: tp.Numpy.Placeholder((8,), dtype=flow.int32)) -> tp.Numpy:
    logits = flow.layers.dense(x, 3, name="dense")
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                       momentum=0).minimize(loss)
    return loss

rank = int(os.environ["RANK"])
rng = np.random.default_rng(0)
for step in range(4):
    train_job(rng.random((8, 4), dtype=np.float32), rng.integers(0, 3, 8).astype(np.int32))
    flow.checkpoint.save(os.path.join(sys.argv[1], f"step{step}"))
    if rank == 1 and step == 1:
        os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_rank_stops_the_others_and_leaves_whole_checkpoints(tmp_path):
    script = tmp_path / "killed.py"
    script.write_text(KILLED_RANK_SCRIPT)
    checkpoints = tmp_path / "ck"
    result = run(script, 2, checkpoints, timeout=60)
    assert result.returncode == 128 + 9, result.stderr[-2000:]
    assert "rank 1 of 2 was killed by signal 9 (SIGKILL) first" in result.stderr
    assert "LostRankError: rank 0 of 2: another rank's process ended during an all-reduce" \
        in result.stderr
    saved = sorted(os.listdir(checkpoints))
    assert saved[:2] == ["step0", "step1"] and len(saved) <= 3, saved   # no temporary folder
    for name in saved:
        assert (checkpoints / name / "snapshot_done").exists(), name


def test_a_stalled_rank_is_named(tmp_path):
    script = write_script(tmp_path, "mlp", stall_rank=1)
    result = run(script, 2, tmp_path / "ck", timeout=60, env={"ONNXJOB_DIST_TIMEOUT": "3"})
    assert result.returncode != 0
    assert "rank 0 of 2 waited 3 s (ONNXJOB_DIST_TIMEOUT) in an all-reduce" in result.stderr
    assert "rank 1 of 2 is still running: stopping it" in result.stderr


def test_the_batch_must_divide_by_the_world_size(monkeypatch):
    from onnxjob.runtime import distributed
    monkeypatch.setenv("WORLD_SIZE", "3")
    # (the ranks' shared seed, drawn as the session starts, as rank 0 draws it)
    monkeypatch.setattr(distributed, "broadcast_from_rank0", lambda values: values)
    import onnxjob.typing as tp

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((8, 2))) -> tp.Numpy:
        w = flow.get_variable("w", (2, 1), initializer=flow.zeros_initializer())
        loss = flow.math.reduce_mean(flow.matmul(x, w))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)
        return loss

    with pytest.raises(ValueError,
                       match=r"test_distributed\.py:\d+: .*must divide by the world size 3"):
        job(np.zeros((8, 2), np.float32))


@pytest.fixture
def rank_0_of_2(monkeypatch):
    """This process as rank 0 of 2 until its first collective (the variables' broadcast,
    the identity here): enough to compile a data-parallel step."""
    from onnxjob.runtime import distributed
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(distributed, "broadcast_from_rank0", lambda values: values)
    flow.clear_default_session()
    yield
    flow.clear_default_session()


def test_a_graph_that_cannot_be_split_names_the_users_line(rank_0_of_2):
    """A job that takes some of the batch's rows cannot run on a rank's share: the error
    names the op and the line of the job's body."""
    import onnxjob.typing as tp
    from onnxjob.graph.split_batch import SplitError

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((8, 2))) -> tp.Numpy:
        w = flow.get_variable("w", (2, 1), initializer=flow.ones_initializer())
        y = flow.matmul(x, w)
        first_rows = flow.slice(y, [0, 0], [4, 1])       # the first half of the batch
        loss = flow.math.reduce_mean(first_rows)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)
        return loss

    with open(__file__) as source:
        line = next(i for i, text in enumerate(source, 1) if "first_rows = flow.slice" in text)
    with pytest.raises(SplitError, match=rf"test_distributed\.py:{line}: .*cannot split Slice .*"
                                         r"some of the batch's rows \(0:4:1 of 8\)"):
        job(np.zeros((8, 2), np.float32))


MIRRORED_SCRIPT = """import json, os, sys
import numpy as np
import onnxjob as flow
import onnxjob.typing as tp

mode = sys.argv[1]          # "list": every rank passes both devices' rows; "own": its own
if mode == "list":
    flow.config.gpu_device_num(2)
flow.config.seed(3)
config = flow.function_config()
config.default_logical_view(flow.scope.mirrored_view())

@flow.global_function(type="train", function_config=config)
def train_job(x: tp.ListNumpy.Placeholder((6, 4)),
              y: tp.ListNumpy.Placeholder((6,), dtype=flow.int32)) -> tp.ListNumpy:
    init = flow.random_normal_initializer(stddev=0.3)
    h = flow.layers.dense(x, 5, activation=flow.nn.relu, kernel_initializer=init, name="h")
    logits = flow.layers.dense(h, 3, kernel_initializer=init, name="out")
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.5]),
                       momentum=0.9).minimize(loss)
    return loss

rank = int(os.environ.get("RANK", "0"))
losses = []
for step in range(3):
    rng = np.random.default_rng(step)
    x = rng.standard_normal((10, 4)).astype(np.float32)
    y = rng.integers(0, 3, 10).astype(np.int32)
    parts = ([x[:6], x[6:]], [y[:6], y[6:]])            # 6 rows on device 0, 4 on device 1
    if mode == "own":
        parts = ([parts[0][rank]], [parts[1][rank]])
    losses.append([v.tolist() for v in train_job(*parts)])
if rank == 0:
    np.savez(sys.argv[2], **{k: v.numpy() for k, v in flow.get_all_variables().items()})
    print(json.dumps(losses))
"""


@pytest.mark.parametrize("mode", ["list", "own"])
def test_a_mirrored_train_job_over_two_ranks_trains_as_two_devices_in_one_process(
        tmp_path, mode):
    """Each rank runs its device's rows (OneFlow's list of both devices, rank r taking
    element r; or one element, its own data): the update and the losses are those of one
    process running both list elements (runtime/mirrored_step.py)."""
    script = tmp_path / "mirrored.py"
    script.write_text(MIRRORED_SCRIPT)
    one = run(script, 1, "list", tmp_path / "one.npz")
    assert one.returncode == 0, one.stderr[-3000:]
    two = run(script, 2, mode, tmp_path / "two.npz")
    assert two.returncode == 0, two.stderr[-3000:]
    one_losses, two_losses = json.loads(one.stdout), json.loads(two.stdout)
    for step, (a, b) in enumerate(zip(one_losses, two_losses)):
        expected = a if mode == "list" else a[:1]     # "own": rank 0 returns its element
        assert len(b) == len(expected), (step, b)
        for x, y in zip(expected, b):
            np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-6)
    single, ranked = np.load(tmp_path / "one.npz"), np.load(tmp_path / "two.npz")
    for name in single.files:
        np.testing.assert_allclose(ranked[name], single[name], rtol=1e-5, atol=1e-6,
                                   err_msg=name)


def _split_cuda_form_for_rank_0(monkeypatch, define_job, check_model):
    """Compile the data-parallel step `define_job()` defines for the CUDA EP (each rank's
    own batch statistics: OneFlow's GPU batch norm, the default there), check its ONNX
    model with `check_model`, split it for rank 0 of 2 and run that part on the CPU EP:
    its gradients must come out partial sums, and finite."""
    import onnx
    import onnxruntime as ort
    monkeypatch.delenv("ONNXJOB_SYNC_BATCH_NORM", raising=False)
    from onnxjob.graph.compiler import compile_job
    from onnxjob.graph.split_batch import Split, split_batch
    from onnxjob.runtime import data_parallel
    from onnxjob.runtime.session import default_session
    define_job()
    session = default_session()
    session.device, session.data_parallel = "cuda", True
    compiled = compile_job(session.jobs["job"], session, 0)
    model = onnx.load_from_string(compiled.serialized())
    check_model(model)
    state_a, _ = data_parallel.state_by_part(model, compiled)
    grads = list(compiled.gradient_outputs.values())
    part_a = data_parallel._extract(model, [i.name for i in model.graph.input],
                                    list(compiled.output_names) + grads + [o for _, o in state_a])
    kinds = split_batch(part_a, compiled.placeholder_names, 0, 2, "job")
    assert grads and not any(isinstance(kinds[g], Split) for g in grads), kinds
    assert {n.domain for n in part_a.graph.node} <= {""}
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim])
             .astype(onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type))
             for i in part_a.graph.input}
    session = ort.InferenceSession(part_a.SerializeToString(), providers=["CPUExecutionProvider"])
    assert all(np.isfinite(g).all() for g in session.run(grads, feeds))


@pytest.mark.parametrize("device,sync,collectives", [
    ("cpu", None, True), ("cuda", None, False), ("cuda", "1", True), ("cpu", "0", False)])
def test_batch_norm_statistics_over_ranks_follow_oneflow_s_device(rank_0_of_2, monkeypatch,
                                                                  device, sync, collectives):
    """Unset, ONNXJOB_SYNC_BATCH_NORM follows OneFlow: its CPU batch norm takes the moments
    of the whole (consistent) batch, so CPU ranks share the whole batch's statistics (a
    collective in the step); its GPU normalization op normalizes each device's rows, so
    CUDA ranks keep their own (none). Set, it decides."""
    import onnxjob.typing as tp
    from onnxjob.graph.compiler import compile_job
    from onnxjob.graph.primitives.collectives import DOMAIN
    from onnxjob.runtime.session import default_session
    if sync is None:
        monkeypatch.delenv("ONNXJOB_SYNC_BATCH_NORM", raising=False)
    else:
        monkeypatch.setenv("ONNXJOB_SYNC_BATCH_NORM", sync)

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((4, 3, 4, 4))) -> tp.Numpy:
        y = flow.layers.batch_normalization(x, axis=1, name="bn")
        loss = flow.math.reduce_mean(y * y)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)
        return loss

    session = default_session()
    session.device, session.data_parallel = device, True
    model = compile_job(session.jobs["job"], session, 0).model
    # (RankLocal, in the same domain, marks a rank's own value: not a collective)
    assert any(n.domain == DOMAIN and n.op_type != "RankLocal"
               for n in model.graph.all_nodes()) == collectives


def test_the_cuda_form_of_a_conv_net_splits_over_the_ranks(rank_0_of_2, monkeypatch):
    """The graph a conv net's data-parallel step gets on the CUDA EP (compiled here: the
    max-pool gradient of KeepOnCuda scatters whole zeros at split indices) split for
    rank 0 of 2 runs on its rows (each rank's own batch statistics: no collective), and
    its gradients come out partial sums."""
    import onnxjob.typing as tp

    def define_job():
        @flow.global_function(type="train")
        def job(x: tp.Numpy.Placeholder((4, 3, 8, 8))) -> tp.Numpy:
            w = flow.get_variable("w", (4, 3, 3, 3),
                                  initializer=flow.random_normal_initializer())
            y = flow.layers.batch_normalization(flow.nn.conv2d(x, w, 1, "SAME"), axis=1)
            pooled = flow.nn.max_pool2d(flow.nn.relu(y), 3, 2, "SAME")   # overlapping windows
            loss = flow.math.reduce_mean(pooled)
            flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(
                loss)
            return loss

    def the_cuda_form(model):
        assert not any(n.op_type == "MaxUnpool" for n in model.graph.node)
    _split_cuda_form_for_rank_0(monkeypatch, define_job, the_cuda_form)


def test_the_cuda_form_under_mixed_precision_splits_over_the_ranks(rank_0_of_2, monkeypatch):
    """Under mixed precision the CUDA form's batch norm statistics come from per-row
    LayerNormalizations (passes/batch_norm_row_statistics.py) and a dense layer's bias
    gradient is a half MatMul by a row of ones over the batch (passes/half_column_sums.py):
    split for rank 0 of 2 both run on the rank's rows (its own statistics; the ones cut
    to its rows) and the gradients come out partial sums."""
    import onnxjob.typing as tp
    config = flow.function_config()
    config.enable_auto_mixed_precision(True)

    def define_job():
        @flow.global_function(type="train", function_config=config)
        def job(x: tp.Numpy.Placeholder((512, 3, 4, 4))) -> tp.Numpy:
            w = flow.get_variable("w", (4, 3, 3, 3),
                                  initializer=flow.random_normal_initializer())
            y = flow.layers.batch_normalization(flow.nn.conv2d(x, w, 1, "SAME"), axis=1)
            h = flow.layers.dense(flow.reshape(flow.nn.relu(y), (512, -1)), 8, name="fc")
            loss = flow.math.reduce_mean(h * h)
            flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(
                loss)
            return loss

    def the_rewrites(model):
        assert {"LayerNormalization", "MatMul"} <= {n.op_type for n in model.graph.node}
    _split_cuda_form_for_rank_0(monkeypatch, define_job, the_rewrites)


RANDOM_STEPS = '''
import json
import os
import sys
import numpy as np
import onnxjob as flow
import onnxjob.typing as tp


@flow.global_function(type="train")
def own_data() -> tp.Numpy:
    # a job that reads its own data is computed whole on every rank: its random values
    # (decode_random, dropout over them) must be every rank's
    x = flow.data.decode_random((6,), flow.float, batch_size=8,
                                initializer=flow.random_uniform_initializer())
    x = flow.nn.dropout(x, rate=0.5)
    w = flow.get_variable("w", (6, 1), initializer=flow.ones_initializer())
    loss = flow.math.reduce_mean(flow.matmul(x, w))
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                       momentum=0).minimize(loss)
    return loss


@flow.global_function(type="train")
def fed(x: tp.Numpy.Placeholder((8, 64))) -> tp.Numpy:
    # the fed batch is split: each rank's rows draw their own dropout masks
    v = flow.get_variable("v", (1,), initializer=flow.zeros_initializer())
    y = flow.nn.dropout(x + v, rate=0.5)
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                       momentum=0).minimize(flow.math.reduce_sum(y, axis=1))
    return y


losses = [float(own_data()) for _ in range(3)]
w = flow.get_all_variables()["w"].numpy().ravel().tolist()
kept = fed(np.ones((8, 64), np.float32)) != 0
# (a file per rank: the ranks' lines on one shared stream can interleave)
with open(f"{sys.argv[1]}.rank{os.environ.get('RANK')}.json", "w") as f:
    json.dump([losses, w, kept.astype(int).tolist()], f)
'''


def test_ranks_draw_alike_what_they_compute_whole_and_apart_on_their_own_rows(tmp_path):
    """Without flow.config.seed the ranks share their jobs' seeds (rank 0's entropy): a job
    reading its own data, computed whole on every rank, shuffled or dropped out the same
    way on each (the ranks' weights drifted apart before); random values over a rank's
    own rows of a fed batch are moved by the rank and differ."""
    script = tmp_path / "random_steps.py"
    script.write_text(RANDOM_STEPS)
    done = run(script, 2, tmp_path / "out")
    assert done.returncode == 0, done.stderr[-3000:]
    rank0, rank1 = (json.loads((tmp_path / f"out.rank{r}.json").read_text()) for r in (0, 1))
    assert rank0[:2] == rank1[:2]           # losses and weights of the whole-batch job
    kept = np.array(rank0[2])               # the gathered batch: 4 rows from each rank
    assert (kept == np.array(rank1[2])).all()
    assert 0.3 < kept.mean() < 0.7
    assert (kept[:4] != kept[4:]).any()     # the ranks' rows drew different masks

"""Checkpoints: OneFlow layout, round trips, resume, atomicity, and bad files."""
import os
import shutil
import pathlib
import selectors
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.errors import CheckpointError
from models import BATCH, define_jobs, mlp, random_batch


def momentum_jobs():
    import onnxjob.typing as tp

    @flow.global_function(type="train")
    def train_job(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28)),
                  labels: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, mlp(images))
        flow.optimizer.SGD(0.05, momentum=0.9).minimize(loss)
        return loss
    return train_job


def test_layout_and_bit_identical_round_trip(tmp_path):
    train_job, _ = define_jobs(mlp)
    images, labels = random_batch()
    train_job(images, labels)
    path = tmp_path / "ckpt"
    flow.checkpoint.save(str(path))
    assert (path / "snapshot_done").is_file() and os.path.getsize(path / "snapshot_done") == 0
    meta = (path / "hidden-weight" / "meta").read_text()
    assert "dim: 512" in meta and "dim: 784" in meta and "data_type: kFloat" in meta
    assert os.path.getsize(path / "hidden-weight" / "out") == 512 * 784 * 4
    step = np.fromfile(path / "System-Train-TrainStep-train_job" / "out", dtype="<i8")
    assert step.tolist() == [1]
    saved = {k: v.numpy() for k, v in flow.get_all_variables().items()}
    loaded = flow.checkpoint.get(str(path))
    assert set(loaded) == set(saved)
    for k, v in loaded.items():
        assert np.array_equal(v.numpy(), saved[k]) and v.numpy().dtype == saved[k].dtype
        assert v.file_path == str(path / k / "out")     # OneFlow's entries name their file


def test_save_clear_rebuild_load_resumes_identically(tmp_path):
    images, labels = random_batch()
    train_job = momentum_jobs()
    for _ in range(3):
        train_job(images, labels)
    flow.checkpoint.save(str(tmp_path / "c"))
    continued = [train_job(images, labels) for _ in range(2)]
    flow.clear_default_session()
    train_job = momentum_jobs()
    flow.load_variables(flow.checkpoint.get(str(tmp_path / "c")))
    resumed = [train_job(images, labels) for _ in range(2)]
    for a, b in zip(continued, resumed):
        assert np.array_equal(a, b)


def test_top_level_save_takes_the_variables_then_the_folder(tmp_path):
    """flow.save(obj, save_dir) (OneFlow 0.4 and 0.5's top-level save) writes the dict it
    is given; flow.load reads it back. A folder first (flow.checkpoint.save's order) is
    taken too; no folder at all is a TypeError naming the line."""
    train_job, _ = define_jobs(mlp)
    train_job(*random_batch())
    variables = flow.get_all_variables()
    saved = {k: v.numpy() for k, v in variables.items()}
    flow.save(variables, str(tmp_path / "a"))
    flow.save(str(tmp_path / "b"), {"hidden-weight": variables["hidden-weight"]})
    loaded = flow.load(str(tmp_path / "a"))
    assert set(loaded) == set(saved)
    for k, v in loaded.items():
        assert np.array_equal(v.numpy(), saved[k])
    assert sorted(os.listdir(tmp_path / "b")) == ["hidden-weight", "snapshot_done"]
    with pytest.raises(TypeError, match=r"test_checkpoint.py:\d+: .*save_dir"):
        flow.save(variables, None)


def test_refuses_non_empty_target(tmp_path):
    define_jobs(mlp)
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "f").write_text("")
    with pytest.raises(AssertionError, match="Non-empty directory"):
        flow.checkpoint.save(str(tmp_path / "x"))


def test_shape_and_dtype_mismatch_name_the_variable():
    define_jobs(mlp)
    with pytest.raises(AssertionError, match="hidden-bias"):
        flow.load_variables({"hidden-bias": np.zeros(3, np.float32)})
    with pytest.raises(AssertionError, match="float64"):
        flow.load_variables({"hidden-bias": np.zeros(512, np.float64)})
    with pytest.raises(RuntimeError, match="is not a variable name"):
        flow.load_variables({"nope": np.zeros(1)}, ignore_mismatch=False)


def test_truncated_file_is_an_error_naming_it(tmp_path):
    define_jobs(mlp)
    flow.checkpoint.save(str(tmp_path / "c"))
    out = tmp_path / "c" / "output-bias" / "out"
    out.write_bytes(out.read_bytes()[:-4])
    with pytest.raises(CheckpointError, match="output-bias"):
        flow.load_variables(flow.checkpoint.get(str(tmp_path / "c")))


SAVING_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np, onnxjob as flow, onnxjob.typing as tp

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        for i, name in enumerate("abc"):
            x = x + flow.math.reduce_sum(flow.get_variable(
                name, (4, 8), initializer=flow.constant_initializer(i + 0.5)))
        return x

    job(np.zeros(2, np.float32))
    flow.checkpoint.save(sys.argv[1])
""")


def _save_in_a_process(tmp_path, target, fault_point=None):
    """A process that saves variables a, b, c ((4, 8) float32 of 0.5, 1.5, 2.5) to
    `target`, stopping at checkpoint.fault_point `fault_point` if given."""
    script = tmp_path / "save.py"
    script.write_text(SAVING_SCRIPT)
    env = dict(os.environ)
    env.pop("ONNXJOB_CHECKPOINT_FAULT_POINT", None)
    if fault_point:
        env["ONNXJOB_CHECKPOINT_FAULT_POINT"] = fault_point
    return subprocess.Popen([sys.executable, str(script), str(target)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait_for_fault_point(proc, point, timeout=120):
    """The temporary folder save announced at `point` (the process now waits there)."""
    from onnxjob.io.checkpoint import FAULT_POINT_ANNOUNCEMENT
    deadline = time.monotonic() + timeout
    seen = []
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stderr, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not selector.select(timeout=1):
                continue
            line = proc.stderr.readline()
            if not line:
                break
            seen.append(line)
            if line.startswith(f"{FAULT_POINT_ANNOUNCEMENT} {point} "):
                return pathlib.Path(line.split(" ", 5)[-1].strip())
    proc.kill()
    raise AssertionError(f"save never reached {point}: {''.join(seen)[-2000:]}")


def _check_the_saved_variables(path):
    entries = flow.checkpoint.get(str(path))
    assert sorted(entries) == ["a", "b", "c"]
    for i, name in enumerate("abc"):
        np.testing.assert_array_equal(entries[name].numpy(), np.full((4, 8), i + 0.5, np.float32))


@pytest.mark.parametrize("point", ["after_first_variable", "before_rename"])
def test_kill_inside_save_leaves_no_accepted_checkpoint(tmp_path, point):
    """SIGKILL while save writes (one variable written, the others not) and just before it
    renames the finished temporary folder into place: no checkpoint at the target, the
    partial folder is refused, and a later save of the same target works."""
    define_jobs(mlp)   # checkpoint.get starts the session, which needs a job
    target = tmp_path / "ckpt"
    proc = _save_in_a_process(tmp_path, target, point)
    folder = _wait_for_fault_point(proc, point)
    written = sorted(os.listdir(folder))
    if point == "after_first_variable":   # the kill lands inside the write
        assert len(written) == 1 and sorted(os.listdir(folder / written[0])) == ["meta", "out"]
    else:
        assert written == ["a", "b", "c", "snapshot_done"]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not target.exists()
    with pytest.raises(AssertionError, match="doesn't exist"):
        flow.checkpoint.get(str(target))
    if point == "after_first_variable":
        with pytest.raises(CheckpointError, match="no snapshot_done"):
            flow.checkpoint.get(str(folder))
    later = _save_in_a_process(tmp_path, target)
    _, errors = later.communicate(timeout=120)
    assert later.returncode == 0, errors
    _check_the_saved_variables(target)


def test_legacy_checkpoint_without_meta_loads_with_the_variables_shape(tmp_path):
    define_jobs(mlp)
    root = tmp_path / "legacy"
    (root / "output-bias").mkdir(parents=True)
    np.arange(10, dtype="<f4").tofile(root / "output-bias" / "out")
    (root / "snapshot_done").write_text("")
    entries = flow.checkpoint.get(str(root))
    with pytest.raises(RuntimeError, match="does not have meta info"):
        entries["output-bias"].numpy()
    flow.load_variables(entries)
    assert np.array_equal(flow.get_all_variables()["output-bias"].numpy(), np.arange(10, dtype=np.float32))


def test_symlinked_variable_folders_are_followed_as_oneflow_follows_them(tmp_path):
    """OneFlow's _GetCheckpoint takes every entry whose `out` os.path.isfile finds, through
    a symbolic link too (a folder composed of links to other snapshots' variables)."""
    define_jobs(mlp)
    flow.checkpoint.save(str(tmp_path / "c"))
    before = flow.get_all_variables()["output-bias"].numpy()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (before + 1).astype("<f4").tofile(elsewhere / "out")
    shutil.copy(tmp_path / "c" / "output-bias" / "meta", elsewhere / "meta")
    shutil.rmtree(tmp_path / "c" / "output-bias")
    os.symlink(elsewhere, tmp_path / "c" / "output-bias")
    flow.load_variables(flow.checkpoint.get(str(tmp_path / "c")))
    np.testing.assert_array_equal(flow.get_all_variables()["output-bias"].numpy(), before + 1)


def test_a_folder_of_out_files_without_snapshot_done_or_meta_loads(tmp_path):
    # what a pruning script writes: <variable>/out only; OneFlow's loader reads every
    # subfolder with an `out` file and takes shape and dtype from the variable
    define_jobs(mlp)
    before = {k: v.numpy() for k, v in flow.get_all_variables().items()}
    root = tmp_path / "pruned"
    pruned = {}
    for name in ("hidden-weight", "output-bias"):
        pruned[name] = (before[name] * 0.5 + 1).astype(before[name].dtype)
        (root / name).mkdir(parents=True)
        pruned[name].astype(pruned[name].dtype.newbyteorder("<")).tofile(root / name / "out")
    (root / "notes").mkdir()                       # no `out`: not a variable
    assert sorted(flow.checkpoint.get(str(root))) == ["hidden-weight", "output-bias"]
    flow.train.CheckPoint().load(str(root))
    after = {k: v.numpy() for k, v in flow.get_all_variables().items()}
    for name, value in after.items():
        np.testing.assert_array_equal(value, pruned.get(name, before[name]))
    # a file of the wrong size for the variable is refused, naming it
    np.zeros(3, "<f4").tofile(root / "output-bias" / "out")
    with pytest.raises(CheckpointError, match="output-bias"):
        flow.train.CheckPoint().load(str(root))


@pytest.mark.parametrize("damage", ["truncated", "shape", "dtype"])
def test_a_bad_later_entry_leaves_every_variable_as_it_was(tmp_path, damage):
    train_job, _ = define_jobs(mlp)
    flow.checkpoint.save(str(tmp_path / "c"))          # the values before training
    images, labels = random_batch()
    train_job(images, labels)
    before = {k: v.numpy().copy() for k, v in flow.get_all_variables().items()}
    bad = tmp_path / "c" / "output-weight"
    names = list(flow.checkpoint.get(str(tmp_path / "c")))
    assert names.index("output-weight") == len(names) - 1, "the bad entry is read last"
    if damage == "truncated":
        (bad / "out").write_bytes((bad / "out").read_bytes()[:-4])
        error = CheckpointError
    elif damage == "shape":
        (bad / "meta").write_text("shape {\n  dim: 512\n  dim: 10\n}\ndata_type: kFloat\n")
        error = AssertionError
    else:
        (bad / "meta").write_text("shape {\n  dim: 10\n  dim: 512\n}\ndata_type: kDouble\n")
        (bad / "out").write_bytes(b"\0" * (10 * 512 * 8))
        error = AssertionError
    with pytest.raises(error) as raised:
        flow.load_variables(flow.checkpoint.get(str(tmp_path / "c")))
    assert "output-weight" in str(raised.value) and str(bad / "out") in str(raised.value)
    after = {k: v.numpy() for k, v in flow.get_all_variables().items()}
    assert after.keys() == before.keys()
    for name, value in before.items():
        assert np.array_equal(after[name], value), f"{name} was overwritten by a failed load"
    # and the old API's load, which goes through the same function
    with pytest.raises(error):
        flow.train.CheckPoint().load(str(tmp_path / "c"))
    assert np.array_equal(flow.get_all_variables()["hidden-weight"].numpy(), before["hidden-weight"])


def test_a_good_load_assigns_every_variable(tmp_path):
    train_job, _ = define_jobs(mlp)
    saved = {k: v.numpy().copy() for k, v in flow.get_all_variables().items()}
    flow.checkpoint.save(str(tmp_path / "c"))
    train_job(*random_batch())
    flow.load_variables(flow.checkpoint.get(str(tmp_path / "c")))
    for name, value in flow.get_all_variables().items():
        assert np.array_equal(value.numpy(), saved[name]), name


def test_get_all_variables_values_are_the_variables_read_when_asked(tmp_path):
    """OneFlow's get_all_variables gives references to the variables' storage: a dict
    held across a load and a train step reads, and saves, what they hold then."""
    flow.clear_default_session()

    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        w = flow.get_variable("w", shape=(3,), initializer=flow.ones_initializer())
        loss = flow.math.reduce_sum(x * w)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                           momentum=0).minimize(loss)
        return loss

    held = flow.get_all_variables()
    flow.load_variables({"w": np.full((3,), 2.0, np.float32)})
    np.testing.assert_array_equal(held["w"].numpy(), [2, 2, 2])
    train(np.ones((2, 3), np.float32))
    np.testing.assert_allclose(held["w"].numpy(), [1.8, 1.8, 1.8], rtol=1e-6)
    held["w"].numpy()[:] = 7        # a copy: the variable is not changed through it
    flow.checkpoint.save(str(tmp_path / "ck"), held)
    np.testing.assert_allclose(np.fromfile(tmp_path / "ck" / "w" / "out", np.float32),
                               [1.8, 1.8, 1.8], rtol=1e-6)
    assert held["w"].shape == (3,) and held["w"].dtype == flow.float32


@pytest.mark.parametrize("meta", [
    "shape {\n  dim: 2\n  dim: 3\n}\ndata_type: kFloat\n",
    "shape {\n  dim: 2\n  dim: 3\n}\ndata_type: 2\n",     # the enum by its number
    "shape {\n  dim: [2, 3]\n}\ndata_type: kFloat\n",     # a repeated field's list form
])
def test_meta_files_in_any_form_protobuf_s_text_format_reads(tmp_path, meta):
    """OneFlow reads a checkpoint's meta with text_format.Parse (check_point_v2.py), which
    takes an enum by number and a repeated field as a list too."""
    (tmp_path / "w").mkdir()
    np.arange(6, dtype=np.float32).tofile(tmp_path / "w" / "out")
    (tmp_path / "w" / "meta").write_text(meta)
    entry = flow.checkpoint.get(str(tmp_path))["w"]
    assert entry.shape == (2, 3) and entry.dtype == flow.float32
    np.testing.assert_array_equal(entry.numpy(), np.arange(6).reshape(2, 3))


def _legacy_train_job():
    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
        w = flow.get_variable("w", (3, 2), initializer=flow.random_normal_initializer())
        b = flow.get_variable("b", (2,), initializer=flow.constant_initializer(0.25))
        loss = flow.math.reduce_mean(flow.matmul(x, w) + b)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                           momentum=0.9).minimize(loss)
        return loss
    return train


def test_legacy_init_sets_every_variable_back_to_its_first_value():
    """With legacy model io, CheckPoint().init() runs OneFlow's model-init job: every
    variable, optimizer state and train step included, drawn again from its initializer
    with its own fixed seed (model_init_kernel.cpp), the values it started with (a K-fold
    script's folds start alike). (With the v2 model io it does nothing.)"""
    flow.config.enable_legacy_model_io(True)
    train = _legacy_train_job()
    check_point = flow.train.CheckPoint()
    check_point.init()
    first = {k: v.numpy().copy() for k, v in flow.get_all_variables().items()}
    x = np.ones((4, 3), np.float32)
    losses = [train(x) for _ in range(3)]
    moved = flow.get_all_variables()
    assert not np.array_equal(moved["w"].numpy(), first["w"])
    check_point.init()
    for name, value in flow.get_all_variables().items():
        np.testing.assert_array_equal(value.numpy(), first[name], err_msg=name)
    np.testing.assert_array_equal([train(x) for _ in range(3)], losses)


def test_legacy_load_initializes_what_the_folder_lacks(tmp_path):
    """With legacy model io, OneFlow's model-load job initializes a variable the
    checkpoint has no folder for (model_load_kernel.cpp); the v2 load keeps its value."""
    flow.config.enable_legacy_model_io(True)
    train = _legacy_train_job()
    x = np.ones((4, 3), np.float32)
    train(x)
    flow.checkpoint.save(str(tmp_path / "ck"))
    shutil.rmtree(tmp_path / "ck" / "b")
    train(x)
    assert not np.array_equal(flow.get_all_variables()["b"].numpy(), [0.25, 0.25])
    flow.train.CheckPoint().load(str(tmp_path / "ck"))
    np.testing.assert_array_equal(flow.get_all_variables()["b"].numpy(), [0.25, 0.25])
    saved_w = flow.checkpoint.get(str(tmp_path / "ck"))["w"].numpy()
    np.testing.assert_array_equal(flow.get_all_variables()["w"].numpy(), saved_w)

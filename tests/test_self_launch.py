"""Ranks a plain `python script.py` starts for itself (onnxjob/frontend/ranks.py,
onnxjob/launch.py): `flow.config.cpu_device_num(n)` trains as one process on the whole batch
would; two "machines" on localhost (`flow.env.machine` + `ctrl_port`, NODE_RANK) as well; a
crashing, a hung or an interrupted rank stops every rank, named. Real subprocesses, gloo."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="data-parallel training needs torch.distributed "
                                            "(pip install 'onnxjob[distributed]')")
if not torch.distributed.is_available():
    pytest.skip("this PyTorch build has no torch.distributed", allow_module_level=True)

BATCH = 12      # divides by 1, 2, 3 and 4 ranks

# the doc MLP (tests/test_distributed.py) in a script that asks for its devices itself;
# argv: devices, output folder; FAIL / STALL / SLEEP: what one rank does after step 1
SCRIPT = """\
import json, os, sys, time
import numpy as np
{import_flow}
devices, out = int(sys.argv[1]), sys.argv[2]
flow.config.cpu_device_num(devices)

@flow.global_function(type="train")
def train_job(images: tp.Numpy.Placeholder(({batch}, 1, 28, 28), dtype=flow.float),
              labels: tp.Numpy.Placeholder(({batch},), dtype=flow.int32)) -> tp.Numpy:
    init = flow.truncated_normal(0.1)
    flat = flow.reshape(images, [images.shape[0], -1])
    hidden = flow.layers.dense(flat, 32, activation=flow.nn.relu, kernel_initializer=init,
                               name="hidden")
    logits = flow.layers.dense(hidden, 10, kernel_initializer=init, name="output")
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                       momentum=0.9).minimize(loss)
    return loss

{machines}
# the ranks draw different values: rank 0's are broadcast
flow.config.seed(5 + int(os.environ.get("RANK", "0")))
rng = np.random.default_rng(0)
losses = []
for step in range(3):
    x = rng.random(({batch}, 1, 28, 28), dtype=np.float32)
    y = rng.integers(0, 10, {batch}).astype(np.int32)
    losses.append(train_job(x, y).tolist())
    # RANK: set in each rank once the session has started (in the process that was started
    # by hand, only then when it waited for flow.env.machine)
    rank = os.environ.get("RANK", "0")
    if step == 0:
        with open(os.path.join(out, "pid" + rank), "w") as f:
            f.write(str(os.getpid()))
        if rank == os.environ.get("FAIL"):
            raise RuntimeError("rank " + rank + " fails on purpose")
        if rank == os.environ.get("STALL") or os.environ.get("SLEEP"):
            time.sleep(120)
if rank == "0":
    np.savez(os.path.join(out, "variables.npz"),
             **{{k: v.numpy() for k, v in flow.get_all_variables().items()}})
print(json.dumps(losses))
"""
ONNXJOB = "import onnxjob as flow\nimport onnxjob.typing as tp"
ONEFLOW = "import oneflow.compatible.single_client as flow\nimport oneflow.typing as tp"
MACHINES = """\
flow.env.machine([{"addr": "127.0.0.1"}, {"addr": "127.0.0.2"}])   # after the jobs, as
flow.env.ctrl_port(int(os.environ["TEST_CTRL_PORT"]))                # OneFlow-Benchmark"""


def write_script(tmp_path, oneflow=False, machines=False):
    script = tmp_path / "train.py"
    text = SCRIPT.format(import_flow=ONEFLOW if oneflow else ONNXJOB, batch=BATCH,
                         machines=MACHINES if machines else "")
    script.write_text(text)
    return script


def environment(**extra):
    """This environment (PYTHONPATH included) without any rank's variables."""
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
            "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return {**env, "ONNXJOB_DEVICE": "cpu", **{k: str(v) for k, v in extra.items()}}


def start(command, sigint=signal.SIG_DFL, **extra):
    """Start `command` with SIGINT's disposition `sigint`, set here rather than inherited
    from whoever runs the tests: SIG_DFL as in a terminal's foreground, SIG_IGN as a job
    that a script starts in the background has it."""
    return subprocess.Popen([str(c) for c in command], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=environment(**extra),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, sigint))


# the SIGINT disposition the started process inherits: it stops its ranks either way
INHERITED_SIGINT = pytest.mark.parametrize("sigint", [signal.SIG_DFL, signal.SIG_IGN],
                                           ids=["sigint-default", "sigint-ignored"])


def finish(process, timeout=60):
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def train(tmp_path, devices, *prefix, **extra):
    """(losses, variables) of `python [prefix] train.py devices out`; rank 0's output."""
    out = tmp_path / f"out{devices}"
    out.mkdir()
    code, stdout, stderr = finish(start([sys.executable, *prefix, tmp_path / "train.py",
                                         devices, out], **extra))
    assert code == 0, stderr
    # every rank ran (a cpu_device_num that started none would compare one process with itself)
    assert sorted(p.name for p in out.glob("pid*")) == [f"pid{r}" for r in range(devices)]
    with np.load(out / "variables.npz") as variables:
        return json.loads(stdout), dict(variables)


def assert_same_training(many, one):
    np.testing.assert_allclose(many[0], one[0], rtol=1e-5)
    assert sorted(many[1]) == sorted(one[1])
    for name, value in one[1].items():
        np.testing.assert_allclose(many[1][name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def gone(pid, within=15.0):
    """True when process `pid` has ended (or become a zombie) within `within` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.1)
    return False


def test_cpu_device_num_2_trains_as_one_process_on_the_whole_batch(tmp_path):
    """`python train.py` with cpu_device_num(2): rank 1 starts itself; the whole batch's
    losses (gathered) and the weights equal one process's, which cpu_device_num(1) is."""
    write_script(tmp_path)
    assert_same_training(train(tmp_path, 2), train(tmp_path, 1))


def test_three_ranks_of_a_oneflow_script_under_onnxjob_run(tmp_path):
    """`python -m onnxjob run train.py` (the oneflow alias) with cpu_device_num(3): the
    ranks run the same `-m onnxjob run` command."""
    write_script(tmp_path, oneflow=True)
    assert_same_training(train(tmp_path, 3, "-m", "onnxjob", "run"),
                         train(tmp_path, 1, "-m", "onnxjob", "run"))


def test_two_machines_on_localhost_train_as_one_process(tmp_path):
    """Two `python train.py 2 out` with NODE_RANK 0 and 1, the machine list and port given
    after the jobs: 4 ranks (node_rank * 2 + i) equal one process on the whole batch."""
    from onnxjob.launch import free_port
    write_script(tmp_path, machines=True)
    port = free_port()
    out = tmp_path / "out"
    out.mkdir()
    nodes = [start([sys.executable, tmp_path / "train.py", 2, out], NODE_RANK=node,
                   TEST_CTRL_PORT=port) for node in (0, 1)]
    results = [finish(node) for node in nodes]
    for code, _, stderr in results:
        assert code == 0, stderr
    with np.load(out / "variables.npz") as variables:
        four = json.loads(results[0][1]), dict(variables)
    assert sorted(p.name for p in out.glob("pid*")) == ["pid0", "pid1", "pid2", "pid3"]
    (tmp_path / "train.py").write_text((tmp_path / "train.py").read_text().replace(
        MACHINES, ""))
    assert_same_training(four, train(tmp_path, 1))


def run_failing(tmp_path, timeout=60, sigint=signal.SIG_DFL, **extra):
    script = write_script(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    began = time.monotonic()
    code, _, stderr = finish(start([sys.executable, script, 2, out], sigint, **extra), timeout)
    pids = {p.name: int(p.read_text()) for p in out.glob("pid*")}
    return code, stderr, pids, time.monotonic() - began


def test_a_crashing_rank_is_named_and_every_rank_stops(tmp_path):
    code, stderr, pids, _ = run_failing(tmp_path, FAIL=1)
    assert code != 0
    assert "rank 1 fails on purpose" in stderr
    assert "onnxjob: rank 1 of 2 exited with status 1" in stderr
    assert all(gone(pid) for pid in pids.values())


def test_a_hung_rank_is_named_and_stopped(tmp_path):
    """Rank 1 never reaches step 2's all-reduce: rank 0 gives up after
    ONNXJOB_DIST_TIMEOUT and rank 1 is named as stalled and stopped."""
    code, stderr, pids, _ = run_failing(tmp_path, STALL=1, ONNXJOB_DIST_TIMEOUT=3)
    assert code != 0
    assert "rank 0 of 2 waited 3 s (ONNXJOB_DIST_TIMEOUT) in an all-reduce" in stderr
    assert "onnxjob: rank 1 of 2 is still running: stopping it (it never reached" in stderr
    assert gone(pids["pid1"])


@INHERITED_SIGINT
def test_a_hung_rank_0_is_stopped_by_the_rank_that_timed_out(tmp_path, sigint):
    """Rank 0 (the process the user started) stalls: rank 1 times out, and rank 0 is
    interrupted where it stalled, named, and exits with rank 1's status."""
    code, stderr, pids, _ = run_failing(tmp_path, sigint=sigint, STALL=0,
                                        ONNXJOB_DIST_TIMEOUT=3)
    assert code == 1, stderr
    assert "onnxjob: rank 1 of 2 exited with status 1" in stderr
    assert "rank 0 of 2 was still running when another rank failed; it was stopped here" in stderr
    assert "onnxjob: rank 0 of 2 is still running: stopping it" in stderr
    assert all(gone(pid) for pid in pids.values())


def interrupted(tmp_path, *prefix, signum=signal.SIGINT, sigint=signal.SIG_DFL):
    """Start `python [prefix] train.py 2 out` (every rank sleeps after step 1) with SIGINT's
    disposition `sigint`, send `signum` to that process alone (not its process group), once
    both ranks wrote their pid files; returns (exit status, stderr, the ranks' pids)."""
    script = write_script(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    process = start([sys.executable, *prefix, script, 2, out], sigint, SLEEP=1)
    deadline = time.monotonic() + 60
    while len(list(out.glob("pid*"))) < 2 and time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        time.sleep(0.1)
    pids = [int((out / f"pid{rank}").read_text()) for rank in (0, 1)]
    process.send_signal(signum)
    code, _, stderr = finish(process, timeout=30)
    return code, stderr, pids


@INHERITED_SIGINT
def test_ctrl_c_on_the_started_process_stops_every_rank(tmp_path, sigint):
    code, stderr, pids = interrupted(tmp_path, sigint=sigint)
    assert code != 0
    assert "onnxjob: rank 0 of 2 was interrupted" in stderr
    assert "onnxjob: rank 1 of 2 is still running: stopping it (rank 0 was interrupted)" in stderr
    assert gone(pids[1])


def test_sigterm_on_the_started_process_stops_every_rank(tmp_path):
    code, stderr, pids = interrupted(tmp_path, signum=signal.SIGTERM, sigint=signal.SIG_IGN)
    assert code == 128 + signal.SIGTERM, stderr
    assert "onnxjob: rank 0 of 2 got SIGTERM" in stderr
    assert "onnxjob: rank 1 of 2 is still running: stopping it (rank 0 got SIGTERM)" in stderr
    assert gone(pids[1])


@INHERITED_SIGINT
def test_ctrl_c_on_the_launcher_names_and_stops_its_ranks(tmp_path, sigint):
    """`python -m onnxjob run --nproc 2` (its ranks ask for cpu_device_num(2) and start
    none: they are ranks already)."""
    code, stderr, pids = interrupted(tmp_path, "-m", "onnxjob", "run", "--nproc", 2,
                                     sigint=sigint)
    assert code == 130
    assert "onnxjob: rank 0 of 2 is still running: stopping it (the launcher was " \
           "interrupted)" in stderr
    assert "onnxjob: rank 1 of 2 is still running" in stderr
    assert all(gone(pid) for pid in pids)


def test_sigterm_on_the_launcher_names_and_stops_its_ranks(tmp_path):
    code, stderr, pids = interrupted(tmp_path, "-m", "onnxjob", "run", "--nproc", 2,
                                     signum=signal.SIGTERM, sigint=signal.SIG_IGN)
    assert code == 128 + signal.SIGTERM, stderr
    assert "onnxjob: rank 0 of 2 is still running: stopping it (the launcher was " \
           "terminated (SIGTERM))" in stderr
    assert "onnxjob: rank 1 of 2 is still running" in stderr
    assert all(gone(pid) for pid in pids)


def test_an_export_imports_the_script_without_starting_ranks(tmp_path):
    """`python -m onnxjob export` runs the script's top (cpu_device_num(2) included) in
    one process: it writes the job of one process, on the whole batch."""
    import onnx
    script = write_script(tmp_path)
    imports = tmp_path / "imports"
    imports.mkdir()
    top = script.read_text().split("rng = ")[0]      # no training loop
    # each process that runs the script's top leaves a file: its pid and RANK
    top = top.replace("devices, out = int(sys.argv[1]), sys.argv[2]\n",
                      f"devices, out = 2, {str(imports)!r}\n"
                      "open(os.path.join(out, '%d-%s' % (os.getpid(), "
                      "os.environ.get('RANK', 'none'))), 'w').close()\n")
    script.write_text(top)
    export = start([sys.executable, "-m", "onnxjob", "export", f"{script}:train_job",
                    "-o", tmp_path / "train.onnx"])
    code, _, stderr = finish(export)
    assert code == 0, stderr
    assert sorted(os.listdir(imports)) == [f"{export.pid}-none"], "ranks started"
    model = onnx.load(str(tmp_path / "train.onnx"))
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim]
              for i in model.graph.input}
    assert shapes["images"] == [BATCH, 1, 28, 28] and shapes["labels"] == [BATCH]


def test_python_c_is_refused_with_what_to_run_instead():
    result = subprocess.run([sys.executable, "-c", "import onnxjob as flow\n"
                             "flow.config.cpu_device_num(2)"], capture_output=True, text=True,
                            env=environment(), timeout=60)
    assert result.returncode == 1
    assert "SelfLaunchError: flow.config.cpu_device_num(2) starts 2 ranks" in result.stderr
    assert "`python -m onnxjob run --nproc 2 script.py`" in result.stderr


# -- in this process: when ranks start, and when not ------------------------------------

def test_a_test_runner_runs_as_one_process_with_a_warning():
    import onnxjob as flow
    from onnxjob.frontend import ranks
    ranks._warned.clear()
    with pytest.warns(UserWarning, match=r"cpu_device_num\(2\) under _pytest: .* one process"):
        flow.config.cpu_device_num(2)
    assert not ranks._started and "RANK" not in os.environ


def test_a_launched_rank_starts_no_ranks(monkeypatch):
    import onnxjob as flow
    from onnxjob.frontend import ranks
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(ranks, "_test_runner", lambda: None)
    flow.config.cpu_device_num(4)
    assert not ranks._started


def test_gpu_device_num_warns_once_that_it_runs_one_device():
    """Here, as it is (no GPU in the test machines): one device, said once with why."""
    import onnxjob as flow
    from onnxjob.frontend import ranks
    ranks._warned.clear()
    with pytest.warns(UserWarning, match=r"gpu_device_num\(8\): onnxjob runs this process's "
                                         r"jobs on one device.*; here .+\. "
                                         r"flow\.config\.cpu_device_num\(8\)") as caught:
        flow.config.gpu_device_num(8)
    assert caught[0].filename == __file__          # the program's line, not onnxjob's
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flow.config.gpu_device_num(8)
    assert not ranks._started and not ranks._gpu_ranks


@pytest.fixture
def gpus(monkeypatch):
    """Fake what gpu_device_num sees: fake(cuda_ep, count) (count None: torch's own
    answer); the ranks it would start are recorded in the returned list."""
    from onnxjob.frontend import ranks
    from onnxjob.runtime import backend, cuda_libraries
    monkeypatch.setattr(ranks, "_warned", set())
    monkeypatch.setattr(ranks, "_gpu_ranks", [])
    monkeypatch.setattr(ranks, "_test_runner", lambda: None)
    for variable in ("RANK", "WORLD_SIZE", "NODE_RANK", "ONNXJOB_DEVICE"):
        monkeypatch.delenv(variable, raising=False)
    started = []
    monkeypatch.setattr(ranks, "_start", lambda what, local, *a, **k: started.append(
        (what, local, k.get("device"))))

    def fake(cuda_ep, count=None):
        monkeypatch.setattr(backend, "cuda_usable", lambda: cuda_ep)
        monkeypatch.setattr(cuda_libraries, "provider_load_error", lambda: (
            None if cuda_ep else "the installed onnxruntime is a CPU-only build (pip ...)"))
        if count is not None:
            monkeypatch.setattr(ranks, "visible_gpus", lambda: (count, None))
    return fake, started


@pytest.mark.parametrize("cuda_ep,count,listed,why", [
    (False, 4, None, r"onnxruntime cannot use the GPU: the installed onnxruntime is a "
                     r"CPU-only build"),
    (True, 2, "0,1", r"only 2 GPU\(s\) are visible \(CUDA_VISIBLE_DEVICES=0,1\)"),
    (True, 0, None, r"only 0 GPU\(s\) are visible\. "),
])
def test_gpu_device_num_says_why_it_runs_one_device(monkeypatch, gpus, cuda_ep, count,
                                                     listed, why):
    fake, started = gpus
    fake(cuda_ep, count)
    if listed is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", listed)
    import onnxjob as flow
    with pytest.warns(UserWarning, match=rf"gpu_device_num\(4\): .* one device .*here {why}"):
        flow.config.gpu_device_num(4)
    assert not started


def test_gpu_device_num_needs_a_cuda_torch(gpus):
    """The CUDA EP alone is not enough: the ranks all-reduce torch's CUDA tensors."""
    fake, started = gpus
    fake(True)
    from onnxjob.frontend import ranks
    if torch.cuda.is_available():
        pytest.skip("this torch has CUDA")
    assert ranks.gpu_ranks_obstacle(2) == f"this torch has no CUDA (torch {torch.__version__})"


def test_gpu_device_num_with_enough_gpus_starts_a_rank_per_gpu(gpus):
    fake, started = gpus
    fake(True, 4)
    import warnings
    import onnxjob as flow
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flow.config.gpu_device_num(4)
        flow.config.gpu_device_num(1)       # one device: nothing to start
    assert started == [("flow.config.gpu_device_num(4)", 4, "cuda")]


def test_gpu_ranks_of_several_machines_start_with_the_session(monkeypatch, gpus):
    """gpu_device_num(2) before the machine list: 2 ranks a machine, a GPU each, started
    when the session starts (as cpu_device_num's)."""
    fake, started = gpus
    fake(True, 2)
    from onnxjob.frontend import ranks
    monkeypatch.setattr(ranks, "_node_rank", lambda machines: 1)
    ranks.on_gpu_device_num(2)
    assert started == [("flow.config.gpu_device_num(2)", 2, "cuda")]
    started.clear()
    ranks._gpu_ranks[:] = [2]
    monkeypatch.setenv("NODE_RANK", "1")
    ranks.on_gpu_device_num(2, ["10.0.0.1", "10.0.0.2"], None)    # no port yet: waits
    assert not started
    ranks.before_session_start(1, ["10.0.0.1", "10.0.0.2"], 29500)
    assert started == [("flow.env.machine(['10.0.0.1', '10.0.0.2'])", 2, "cuda")]


def test_a_started_gpu_rank_runs_on_the_gpu(monkeypatch):
    """_start with device "cuda": each rank's environment asks for the GPU (a rank that
    cannot use one fails instead of training on the CPU); LOCAL_RANK picks it."""
    from onnxjob import launch, spawned_ranks
    from onnxjob.frontend import ranks
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items()
                                        if k not in ("RANK", "WORLD_SIZE", "ONNXJOB_DEVICE")})
    monkeypatch.setattr(ranks, "_started", [])
    monkeypatch.setattr(ranks, "rerun_command", lambda what, n: ["python", "train.py"])
    monkeypatch.setattr(spawned_ranks, "SpawnedRanks", lambda *a: None)
    envs = []
    monkeypatch.setattr(launch, "start_rank", lambda command, env, **k: envs.append(env))
    ranks._start("flow.config.gpu_device_num(3)", 3, device="cuda")
    assert [(e["LOCAL_RANK"], e["ONNXJOB_DEVICE"]) for e in envs] == [("1", "cuda"),
                                                                        ("2", "cuda")]
    assert os.environ["RANK"] == "0" and os.environ["ONNXJOB_DEVICE"] == "cuda"


@pytest.mark.parametrize("argv,main_file,expected", [
    (["python", "train.py", "--lr", "1"], "/w/train.py", ["/w/train.py", "--lr", "1"]),
    (["python", "-u", "-X", "dev", "train.py"], "/w/train.py", ["-u", "-X", "dev", "/w/train.py"]),
    (["python", "-m", "onnxjob", "run", "t.py", "a"], "/w/t.py",
     ["-m", "onnxjob", "run", "t.py", "a"]),
    (["python", "-c", "pass"], None, "python -c"),
    (["python", "-uc", "pass"], None, "python -c"),
    (["python", "-"], None, "stdin"),
    (["python"], None, "stdin"),
])
def test_the_command_that_runs_the_program_again(monkeypatch, argv, main_file, expected):
    import types
    from onnxjob.frontend import ranks
    monkeypatch.setattr(sys, "orig_argv", argv)
    monkeypatch.setitem(sys.modules, "__main__", types.SimpleNamespace(__file__=main_file))
    monkeypatch.setattr(os.path, "isfile", lambda path: path == main_file)
    if isinstance(expected, str):
        with pytest.raises(ranks.SelfLaunchError, match=(
                rf"cpu_device_num\(2\) starts 2 ranks .*{expected}.* cannot be run again: .*"
                r"python -m onnxjob run --nproc 2 script\.py")):
            ranks.rerun_command("flow.config.cpu_device_num(2)", 2)
    else:
        assert ranks.rerun_command("flow.config.cpu_device_num(2)", 2) == \
            [sys.executable] + expected


def test_which_machine_this_is(monkeypatch):
    from onnxjob.frontend import ranks
    monkeypatch.delenv("NODE_RANK", raising=False)
    # 192.0.2.1 is TEST-NET-1: never an address of this machine
    assert ranks._node_rank(["192.0.2.1", "127.0.0.1"]) == 1
    with pytest.raises(ranks.SelfLaunchError, match="cannot tell which machine.*NODE_RANK"):
        ranks._node_rank(["127.0.0.1", "127.0.0.2"])
    monkeypatch.setenv("NODE_RANK", "2")
    with pytest.raises(ranks.SelfLaunchError, match="NODE_RANK='2'.* 0 to 1"):
        ranks._node_rank(["127.0.0.1", "127.0.0.2"])


def test_what_a_run_on_several_machines_lacks_is_named(monkeypatch):
    from onnxjob.frontend import ranks
    monkeypatch.setattr(ranks, "_test_runner", lambda: None)
    for variable in ("RANK", "WORLD_SIZE", "NODE_RANK"):
        monkeypatch.delenv(variable, raising=False)
    with pytest.raises(ranks.SelfLaunchError, match=r"needs the rendezvous port: "
                                                    r"flow\.env\.ctrl_port\(PORT\)"):
        ranks.before_session_start(2, ["127.0.0.1", "127.0.0.2"], None)
    monkeypatch.setenv("NODE_RANK", "1")
    with pytest.raises(ranks.SelfLaunchError, match="NODE_RANK=1 is set but the script gives "
                                                    "no flow.env.machine list"):
        ranks.before_session_start(2, [], None)
    # ranks started for one machine, then a list of two: say what to set
    monkeypatch.setattr(ranks, "_started", [(1, None)])
    with pytest.raises(ranks.SelfLaunchError, match="set NODE_RANK"):
        ranks.on_machines(["127.0.0.1", "127.0.0.2"])

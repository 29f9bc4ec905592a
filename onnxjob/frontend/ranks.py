"""Ranks that a plain `python script.py` starts for itself, as OneFlow users scale: by
asking for devices in the script (docs/distributed.md).

- One machine: `flow.config.cpu_device_num(n)`, n > 1, starts the other n - 1 ranks at that
  call (it comes at the top of a script, before any job): the same interpreter runs the same
  program again (`sys.orig_argv`: the script or `-m module` and its arguments) with RANK,
  LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set; this process becomes rank 0.
  `flow.config.gpu_device_num(n)` does the same with a GPU per rank (LOCAL_RANK's:
  runtime/distributed.py) where onnxruntime's CUDA EP and n GPUs are usable
  (`gpu_ranks_obstacle`); elsewhere this process runs its jobs on one device, and says why.
- Several machines: `flow.env.machine([{"addr": a}, {"addr": b}, ...])` with
  `flow.env.ctrl_port(p)`, the script started on each machine. This machine's index is
  NODE_RANK, else the one address of the list that is this machine's; its ranks are
  node_rank * local + i (local: cpu_device_num, default 1) and rank 0's address and port are
  the first machine's and p. They start when the session starts (the first job call), when
  the machine list, port and device count are all known (OneFlow-Benchmark gives the
  machines after defining its jobs), or at the cpu_device_num call when NODE_RANK was set
  and the list and port came first.

A process under a launcher (RANK or WORLD_SIZE set: `python -m onnxjob run --nproc`,
torchrun, or a rank started here) never starts ranks. A program that cannot be run again
(`python -c`, stdin, an interactive session) gets SelfLaunchError; a call from a test that a
test runner runs (pytest, unittest) runs as one process, with a warning. The ranks are
watched from this process (spawned_ranks.SpawnedRanks).
"""
import os
import socket
import sys

from onnxjob import launch, settings, spawned_ranks
from onnxjob.source_info import warn_at_user_line

_START_DIR = os.getcwd()        # where a rank starts (the script may chdir before the call)
_started = []                   # this process's SpawnedRanks, or the layout it joined
_exporting = []                 # set while `python -m onnxjob export` imports a script
_warned = set()
_gpu_ranks = []                 # [n] once gpu_device_num(n) asked for n ranks with a GPU each


class SelfLaunchError(RuntimeError):
    """The script asks for several ranks in a way onnxjob cannot start them."""


def exporting(script):
    """`python -m onnxjob export` imports `script`: its device requests start no ranks
    (the export writes the job of one process)."""
    _exporting.append(script)


def under_launcher():
    """True in a rank that a launcher (or this module, in another process) started."""
    return "RANK" in os.environ or "WORLD_SIZE" in os.environ


def _warn_once(key, message):
    if key not in _warned:
        _warned.add(key)
        warn_at_user_line(message)


def _test_runner():
    """The test runner (pytest, unittest, doctest) on the call stack, or None."""
    frame = sys._getframe(1)
    while frame is not None:
        root = str(frame.f_globals.get("__name__", "")).split(".")[0]
        if root in ("_pytest", "pytest", "unittest", "doctest"):
            return root
        frame = frame.f_back
    return None


def rerun_command(what, nproc):
    """[interpreter, its options, script or -m module, arguments]: this program again.
    Raises SelfLaunchError for one that cannot be run again."""
    refuse = (f"{what} starts {nproc} ranks by running this program again in {nproc - 1} "
              "more process(es), but {} cannot be run again: save it as a script and run "
              f"`python -m onnxjob run --nproc {nproc} script.py` (or `python script.py`)")
    ipython = sys.modules.get("IPython")
    if hasattr(sys, "ps1") or (ipython is not None and ipython.get_ipython() is not None):
        raise SelfLaunchError(refuse.format("an interactive session"))
    argv = list(getattr(sys, "orig_argv", ()))
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "-c" or (len(arg) > 2 and arg[0] == "-" and arg[-1] == "c" and
                           set(arg[1:-1]) <= set("bBdEiIOPqRsSuvx")):    # -c, -uc, ...
            raise SelfLaunchError(refuse.format("a program given with `python -c`"))
        if arg == "-m":
            return [sys.executable] + argv[1:]
        if arg in ("-W", "-X", "--check-hash-based-pycs"):
            i += 2
            continue
        if arg == "-":
            break
        if not arg.startswith("-"):
            # the script's absolute path: the program may have changed directory
            if main_file and os.path.isfile(main_file):
                program = os.path.abspath(main_file)
            elif os.path.exists(os.path.join(_START_DIR, arg)):     # a zip or a folder
                program = os.path.join(_START_DIR, arg)
            else:
                break
            return [sys.executable] + argv[1:i] + [program] + argv[i + 1:]
        i += 1
    raise SelfLaunchError(refuse.format("a program read from stdin"))


def _node_rank(addrs):
    """This machine's index in flow.env.machine's list: NODE_RANK, else the one address
    of the list that a socket can be bound to here."""
    variable = os.environ.get("NODE_RANK", "")
    if variable:
        if not variable.isdigit() or int(variable) >= len(addrs):
            raise SelfLaunchError(f"NODE_RANK={variable!r}: flow.env.machine lists "
                                  f"{len(addrs)} machines, so it must be 0 to {len(addrs) - 1}")
        return int(variable)
    local = [i for i, addr in enumerate(addrs) if _is_local(addr)]
    if len(local) != 1:
        raise SelfLaunchError(
            f"flow.env.machine({addrs}): cannot tell which machine this is (addresses of "
            f"this machine in the list: {[addrs[i] for i in local]}); set NODE_RANK to its "
            "index in the list (0 on the first machine)")
    return local[0]


def _is_local(addr):
    try:
        with socket.socket() as s:
            s.bind((addr, 0))
        return True
    except OSError:
        return False


def _start(what, local, node_rank=0, nodes=1, addr=None, port=None, device="cpu"):
    """Become rank node_rank * local of local * nodes and start this machine's other ranks,
    whose jobs run on `device` ("cpu" or "cuda": a GPU each)."""
    command = rerun_command(what, local * nodes) if local > 1 else None
    addr = addr or os.environ.get("MASTER_ADDR") or "127.0.0.1"
    port = port or os.environ.get("MASTER_PORT") or launch.free_port()
    world, first = local * nodes, node_rank * local
    os.environ.update(launch.rank_environment(first, 0, world, addr, port, node_rank, local))
    # cpu_device_num asks for CPU devices: the ranks run on the CPU (gloo); gpu_device_num
    # for GPUs: a rank that cannot use its GPU fails rather than training on the CPU
    os.environ.setdefault(settings.SETTINGS["DEVICE"].variable, device)
    children = {first + i: launch.start_rank(
        command, {**os.environ, **launch.rank_environment(first + i, i, world, addr, port,
                                                         node_rank, local)},
        quiet=True, cwd=_START_DIR) for i in range(1, local)}
    watcher = spawned_ranks.SpawnedRanks(children, first, world) if children else None
    _started.append((nodes, watcher))


def _may_start(what, n):
    """False (with a warning) where ranks must not be started from this call."""
    if _started or under_launcher() or _exporting:
        return False
    runner = _test_runner()
    if runner is not None:
        _warn_once(("runner", what), f"{what} under {runner}: a test cannot be run again as "
                   f"{n} ranks; its jobs run in this one process, each step on the whole "
                   f"batch (the numbers of {n} devices for consistent-view jobs)")
        return False
    return True


def on_cpu_device_num(n, machines, ctrl_port):
    """flow.config.cpu_device_num(n): start this machine's ranks now where everything
    they need is known (see the module doc)."""
    _on_device_num(f"flow.config.cpu_device_num({n})", n, machines, ctrl_port, "cpu")


def _on_device_num(what, n, machines, ctrl_port, device):
    if n <= 1 or not _may_start(what, n):
        return
    if len(machines) > 1 or os.environ.get("NODE_RANK"):
        if len(machines) > 1 and ctrl_port is not None and os.environ.get("NODE_RANK"):
            _start(what, n, _node_rank(machines), len(machines), machines[0], ctrl_port,
                   device=device)
        return      # else at the session's start, when the machines are known
    _start(what, n, device=device)


def on_machines(machines):
    """flow.env.machine(...): refuse a list of several machines after this process
    started ranks for one machine."""
    if len(machines) > 1 and _started and _started[0][0] == 1:
        raise SelfLaunchError(
            f"flow.env.machine({machines}) after flow.config.cpu_device_num(n) (or "
            "gpu_device_num(n)) started this machine's ranks as a run of one machine: set "
            "NODE_RANK (this machine's index in the list) in the environment of each "
            "machine's `python script.py`, so that the ranks start once the machine list is "
            "known, or call flow.env.machine and flow.env.ctrl_port before "
            "flow.config.cpu_device_num")


def before_session_start(local, machines, ctrl_port):
    """The session starts (the first job call): start the ranks that waited for the
    machine list, or refuse what cannot run."""
    node = os.environ.get("NODE_RANK", "")
    device, asked = "cpu", f"flow.config.cpu_device_num({local})"
    if _gpu_ranks:      # gpu_device_num(n) found n GPUs: n ranks a machine, a GPU each
        local, device = _gpu_ranks[0], "cuda"
        asked = f"flow.config.gpu_device_num({local})"
    if len(machines) <= 1:
        if node not in ("", "0") and not under_launcher() and not _exporting:
            raise SelfLaunchError(f"NODE_RANK={node} is set but the script gives no "
                                  "flow.env.machine list of several machines")
        if local > 1 and node and _may_start(asked, local):
            _start(asked, local, device=device)
        return
    what = f"flow.env.machine({machines})"
    if not _may_start(what, local * len(machines)):
        return
    if ctrl_port is None:
        raise SelfLaunchError(f"{what}: a run on several machines needs the rendezvous port: "
                              "flow.env.ctrl_port(PORT), the same free port on every machine")
    _start(what, local, _node_rank(machines), len(machines), machines[0], ctrl_port,
           device=device)


def visible_gpus():
    """The number of GPUs torch sees (CUDA_VISIBLE_DEVICES applied), or why it sees none:
    (count, None) or (0, reason). The ranks' all-reduce runs on torch's CUDA tensors."""
    try:
        import torch
    except ImportError:
        return 0, ("torch is not installed (the ranks all-reduce with torch.distributed: "
                   "pip install 'onnxjob[distributed]')")
    if not torch.cuda.is_available():
        return 0, f"this torch has no CUDA (torch {torch.__version__})"
    return torch.cuda.device_count(), None


def gpu_ranks_obstacle(n):
    """Why flow.config.gpu_device_num(n) cannot start n ranks with a GPU each here (a
    sentence), or None when it can: onnxruntime's CUDA EP usable and n GPUs visible."""
    from onnxjob.runtime import backend, cuda_libraries
    if settings.get("DEVICE") == "cpu":
        return "ONNXJOB_DEVICE=cpu asks for the CPU"
    if not backend.cuda_usable():
        reason = cuda_libraries.provider_load_error() or \
            "its CUDA execution provider did not start a session"
        return f"onnxruntime cannot use the GPU: {reason}"
    count, reason = visible_gpus()
    if reason is not None:
        return reason
    if count < n:
        listed = os.environ.get("CUDA_VISIBLE_DEVICES")
        shown = f" (CUDA_VISIBLE_DEVICES={listed})" if listed is not None else ""
        return f"only {count} GPU(s) are visible{shown}"
    return None


def on_gpu_device_num(n, machines=(), ctrl_port=None):
    """flow.config.gpu_device_num(n): n ranks with a GPU each where that can run (started
    as cpu_device_num's are); elsewhere one device for this process, said once with why."""
    if n <= 1 or under_launcher() or _exporting:
        return
    obstacle = gpu_ranks_obstacle(n)
    if obstacle is None:
        _gpu_ranks[:] = [n]
        _on_device_num(f"flow.config.gpu_device_num({n})", n, machines, ctrl_port, "cuda")
        return
    _warn_once("gpu", f"flow.config.gpu_device_num({n}): onnxjob runs this process's jobs "
               "on one device (the GPU when onnxruntime can use one, else the CPU), each "
               f"train step on the whole batch: the numbers of {n} devices for "
               "consistent-view jobs, at one device's speed. It starts one rank per GPU "
               f"where onnxruntime's CUDA execution provider and {n} GPUs are usable; here "
               f"{obstacle}. flow.config.cpu_device_num({n}) or `python -m onnxjob run "
               f"--nproc {n}` trains as {n} CPU ranks")

"""Helpers that OneFlow model and test code calls around ops (flow.current_machine_id(),
flow.convert_oneflow_dtype_to_numpy_dtype, flow.Size, ...)."""
import os
import shutil
import sys

from onnxjob import dtypes
from onnxjob.compat.generations import renamed_keywords
from onnxjob.frontend.config import current_resource, process_config  # noqa: F401
from onnxjob.graph import tracer
from onnxjob.source_info import user_location, warn_at_user_line


class Size(tuple):
    """flow.Size: a tuple of dimensions."""

    def numel(self):
        n = 1
        for d in self:
            n *= d
        return n

    def index(self, value, start=0, end=None):
        """The first position of `value` in [start, end) (keywords allowed, as OneFlow's
        Size.index; ValueError when absent)."""
        return super().index(value, start, len(self) if end is None else end)


def convert_oneflow_dtype_to_numpy_dtype(oneflow_dtype):
    """The NumPy dtype of a flow dtype (flow.float32 -> numpy.float32)."""
    return dtypes.to_numpy(oneflow_dtype).type


def eager_execution_enabled():
    """False: onnxjob runs every job function lazily (see enable_eager_execution)."""
    return False


@renamed_keywords(val="value")
def enable_eager_execution(value=True):
    """OneFlow's eager mode (0.2-0.4). A job function's ops compute what they compute
    lazily, so onnxjob runs the program's job functions as graphs and warns once: a body
    is traced once, at the session's first call (Python values it reads are taken then,
    as in lazy mode: a call finding a plain value it reads changed traces it again,
    frontend/eager_jobs.py), unless it reads a blob's value (`blob.numpy()`, `numpy_list()`):
    such a body is traced again at every call, as OneFlow's eager mode ran it, with the
    value its graph computes from the call's arguments and the variables
    (runtime/eager_values.py). A job may be defined while the session runs
    (frontend/eager_jobs.py). eager_execution_enabled() stays False, so code that branches
    on it takes the lazy path. `value=False` ends the mode for jobs traced afterwards.
    Eager tensors (flow.Tensor) are onnxjob/eager/; flow.nn.Module is OneFlow <= 0.3's
    lazy helper, not 0.4's eager module."""
    if not value:
        tracer.eager_requested_at = None
        return
    first = tracer.eager_requested_at is None
    tracer.eager_requested_at = user_location()
    if first:
        warn_at_user_line(
            "flow.enable_eager_execution(True): onnxjob runs job functions as graphs, with "
            "the same ops: a job's body runs once, when the session starts (Python values it "
            "reads are taken then), or at every call where it reads a blob's value "
            "(blob.numpy())")


def enable_typing_check(value=True):
    """flow.experimental.enable_typing_check: accepted for compatibility (onnxjob always
    checks the annotations it is given)."""
    return None


def current_machine_id():
    return 0



def default_parallel_num():
    """How many devices OneFlow's default placement of a job names: flow.config's
    gpu_device_num on each machine (cpu_device_num where gpu_device_num is 0)."""
    c = process_config
    return _devices_per_machine() * max(1, c.machine_num)


def default_machine_device_ids():
    """OneFlow's default placement of a job as "machine:devices" strings ("0:0-3" for
    flow.config.gpu_device_num(4)); onnxjob runs it on one device, as it says when the
    count is set (frontend/ranks.py)."""
    n = _devices_per_machine()
    devices = "0" if n == 1 else f"0-{n - 1}"
    return [f"{m}:{devices}" for m in range(max(1, process_config.machine_num))]


def default_placement_on_cpus():
    """Whether OneFlow's default placement is CPUs: where the program asked for no GPU
    (gpu_device_num(0)) or for CPU devices and no GPUs (written for a CPU-only build,
    placement_util.py)."""
    c = process_config
    return c.gpu_device_num == 0 or (not c.gpu_device_num_set and c.cpu_device_num > 1)


def _devices_per_machine():
    """The devices of OneFlow's default placement on each machine: gpu_device_num GPUs,
    or cpu_device_num CPUs (default_placement_on_cpus)."""
    c = process_config
    return max(1, c.cpu_device_num if default_placement_on_cpus() else c.gpu_device_num)


def manual_seed(seed):
    """OneFlow's global seed. onnxjob draws the initial variable values and the random ops
    of the jobs compiled at the next session start from it (the same as flow.config.seed);
    a session already started keeps its draws."""
    process_config.random_seed = int(seed)


def delete_worker_of_multi_process(run_dir):
    """`flow.deprecated.delete_worker_of_multi_process(run_dir)`: as OneFlow's, removes the
    run folder `run_dir` of a multi-process environment's workers (kept, and said so,
    when ONEFLOW_WORKER_KEEP_LOG is set). onnxjob's ranks leave no such folder behind, so a
    program calls this only on a folder of its own."""
    assert run_dir != "", "delete_worker_of_multi_process takes the workers' run folder"
    if os.getenv("ONEFLOW_WORKER_KEEP_LOG"):
        print("worker log kept at localhost:" + run_dir, flush=True)
        return
    if os.path.isdir(run_dir) and not os.path.islink(run_dir):
        shutil.rmtree(run_dir)
    elif os.path.lexists(run_dir):
        os.remove(run_dir)
    else:       # OneFlow's `rm -r` says so and goes on
        print(f"rm: cannot remove '{run_dir}': No such file or directory", file=sys.stderr)
    print("temp run dir removed at localhost:" + run_dir, flush=True)


def delete_worker_by_bootstrap(ssh_port=22):
    """`flow.deprecated.delete_worker_by_bootstrap()`: OneFlow stops, over ssh, the worker
    processes of every machine but the first of a multi-machine env; onnxjob's env is one
    machine (its ranks are processes it starts and stops itself), so there is none."""
    return None


def InitEagerGlobalSession():
    """OneFlow's start of the session its eager tensors ran in. onnxjob's eager tensors
    (flow.Tensor, onnxjob/eager/) run on onnxruntime with no session: nothing to start."""
    return None

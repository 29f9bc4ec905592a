"""Code written for OneFlow runs unchanged: `python -m onnxjob run` and the import alias."""
import os
import subprocess
import sys
import textwrap

import pytest

from onnxjob.errors import UnsupportedAPIError
from zoo import cnns_dir


def run_onnxjob(*args, cwd=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "onnxjob", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def write(path, text):
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_run_resolves_every_oneflow_import_spelling(tmp_path):
    script = write(tmp_path / "script.py", """
        import sys
        import oneflow as flow
        import oneflow.typing as tp
        import oneflow.compatible.single_client as flow5
        import oneflow.compatible.single_client.typing as tp5
        from oneflow.compatible.single_client import typing as tp5b
        import oneflow.core.operator.op_conf_pb2 as op_conf_util
        import oneflow.core.common.data_type_pb2 as data_type
        import oneflow.math
        import onnxjob
        assert flow5 is onnxjob and flow.nn is onnxjob.nn and flow.math is oneflow.math
        assert tp is tp5 is tp5b is onnxjob.typing
        assert op_conf_util.kNone == 0 and op_conf_util.kRelu == 3 and data_type.kFloat == 2
        print("argv", sys.argv[1:], "main", __name__, "path0", sys.path[0])
    """)
    done = run_onnxjob("run", script, "--flag", "x", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"argv ['--flag', 'x'] main __main__ path0 {tmp_path}" in done.stdout


@pytest.mark.parametrize("ranks", [[], ["--nproc", "2"]])
def test_run_m_runs_a_module_of_a_package_as_python_m_does(tmp_path, ranks):
    # OneFlow programs started as `python3 -m gpt-2.src.train`: relative imports need the
    # package, found from the current directory (here a package name with a hyphen)
    package = tmp_path / "gpt-2"
    (package / "src").mkdir(parents=True)
    for init in (package / "__init__.py", package / "src" / "__init__.py"):
        init.write_text("")
    write(package / "src" / "helpers.py", "UNITS = 3\n")
    write(package / "src" / "train.py", """
        import os
        import sys
        import oneflow as flow
        from .helpers import UNITS
        assert flow.nn is __import__("onnxjob").nn
        # (one write: the ranks share the launcher's stdout, unbuffered)
        sys.stdout.write(f"argv {sys.argv[1:]} main {__name__} units {UNITS} file "
                         f"{sys.argv[0].endswith('train.py')} rank {os.environ.get('RANK')}\\n")
    """)
    # (with --nproc, as torchrun's `--nproc_per_node N -m MODULE`: each rank runs it)
    done = run_onnxjob("run", *ranks, "-m", "gpt-2.src.train", "--seq_len=16", "x",
                       cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    line = "argv ['--seq_len=16', 'x'] main __main__ units 3 file True rank"
    assert (done.stdout.count(f"{line} 0") + done.stdout.count(f"{line} 1") == 2 if ranks
            else f"{line} None" in done.stdout)


def test_an_unknown_oneflow_name_names_it_and_the_users_line(tmp_path):
    script = write(tmp_path / "uses_missing.py", """
        import oneflow.compatible.single_client as flow

        flow.nn.not_an_op
    """)
    done = run_onnxjob("run", script, cwd=tmp_path)
    assert done.returncode != 0
    assert "UnsupportedAPIError" in done.stderr
    assert "uses_missing.py:4: flow.nn.not_an_op is not provided by onnxjob" in done.stderr


def test_an_unknown_oneflow_module_names_it_and_the_importing_line(tmp_path):
    script = write(tmp_path / "imports_missing.py", """
        import oneflow.compatible.single_client.framework.session_util
    """)
    done = run_onnxjob("run", script, cwd=tmp_path)
    assert done.returncode != 0
    assert "ModuleNotFoundError" in done.stderr
    assert "imports_missing.py:2: `import oneflow.compatible.single_client.framework" in done.stderr


def test_without_the_hook_there_is_no_oneflow(tmp_path):
    done = subprocess.run([sys.executable, "-c", "import importlib.util, onnxjob; "
                           "print(importlib.util.find_spec('oneflow'))"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.stdout.strip() == "None", done.stdout + done.stderr


def test_library_alias_installs_and_uninstalls():
    import importlib
    import onnxjob
    from onnxjob.compat import install_oneflow_alias, uninstall_oneflow_alias
    install_oneflow_alias()
    try:
        flow = importlib.import_module("oneflow.compatible.single_client")
        assert flow is onnxjob
        with pytest.raises(UnsupportedAPIError, match="test_compat.py:.*flow.no_such_name"):
            flow.no_such_name  # noqa: B018
    finally:
        uninstall_oneflow_alias()
    assert "oneflow" not in sys.modules
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("oneflow")


def test_of_cnn_train_val_trains_resnet50_on_synthetic_data(tmp_path):
    """The unchanged upstream training script, synthetic-data path, 2 iterations."""
    script = os.path.join(cnns_dir(), "of_cnn_train_val.py")
    done = run_onnxjob("run", script, "--model=resnet50", "--batch_size_per_device=2",
                       "--num_examples=4", "--num_epochs=1", "--loss_print_every_n_iter=1",
                       "--model_save_dir=snapshots", "--save_last", cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("train: epoch 1")]
    assert len(lines) == 2, done.stdout[-2000:]
    loss = float(lines[-1].split("loss: ")[1].split(",")[0])
    assert 0 < loss < 20
    snapshot = tmp_path / "snapshots" / "snapshot_epoch_last"
    assert (snapshot / "snapshot_done").is_file()
    assert (snapshot / "Resnet-conv1-weight" / "out").stat().st_size == 64 * 3 * 7 * 7 * 4


def test_helpers_model_code_calls_around_ops():
    import numpy as np
    import onnxjob as flow
    import onnxjob.typing as tp
    assert flow.convert_oneflow_dtype_to_numpy_dtype(flow.float) is np.float32
    assert flow.convert_oneflow_dtype_to_numpy_dtype(flow.int64) is np.int64
    assert flow.eager_execution_enabled() is False
    assert flow.Size((2, 3)) == (2, 3) and flow.Size((2, 3)).numel() == 6
    seen = {}

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        seen["device_tag"] = flow.current_scope().device_parallel_desc_symbol.device_tag
        y = flow.cast_to_current_logical_view(flow.parallel_cast(x, distribute=None))
        counter = flow.get_variable("counter", (3,), initializer=flow.zeros_initializer(),
                                    trainable=False)
        flow.assign(counter, counter + y)
        w = flow.get_variable("w", (3,), initializer=flow.ones_initializer())
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0]),
                           momentum=0).minimize(flow.math.reduce_sum(w * y))
        return counter

    x = np.array([1.0, 2.0, 3.0], np.float32)
    job(x)
    job(x)
    assert seen["device_tag"] == "gpu"      # OneFlow's default placement, wherever it runs
    np.testing.assert_array_equal(flow.get_all_variables()["counter"].numpy(), 2 * x)


def test_current_scope_follows_the_programs_placement():
    """flow.current_scope()'s device tag and device count are those of the placement
    OneFlow gives the op (its layers branch on the tag), not the device onnxjob runs on."""
    import numpy as np
    import onnxjob as flow
    import onnxjob.typing as tp
    seen = {}

    def record(key):
        desc = flow.current_scope().device_parallel_desc_symbol
        seen[key] = (desc.device_tag, desc.parallel_num)

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        record("default")
        with flow.scope.placement("cpu", "0:0-1"):
            record("cpu")
        with flow.scope.placement("gpu", "0:0"):
            record("gpu")
        return x

    job(np.zeros(3, np.float32))
    assert seen == {"default": ("gpu", 1), "cpu": ("cpu", 2), "gpu": ("gpu", 1)}


def test_oneflow_internal_imports_and_refuses_its_names_by_line(tmp_path):
    script = write(tmp_path / "script.py", """
        import oneflow._oneflow_internal
        import oneflow.compatible.single_client as flow
        assert oneflow._oneflow_internal.distribute is flow.distribute
        oneflow._oneflow_internal.GetCurrentMachineId()
    """)
    done = run_onnxjob("run", script, cwd=tmp_path)
    assert done.returncode != 0
    assert "script.py:5" in done.stderr
    assert "oneflow._oneflow_internal.GetCurrentMachineId is not provided" in done.stderr


def test_transpose_util_and_experimental_unittest_resolve(tmp_path):
    script = write(tmp_path / "script.py", """
        from oneflow.compatible.single_client.ops import transpose_util as tu
        from oneflow.compatible.single_client import experimental
        import oneflow.compatible.single_client as flow
        perm = tu.get_perm_when_transpose_axis_to_last_dim(4, 1)
        assert perm == (0, 2, 3, 1), perm
        assert tu.get_inversed_perm(perm) == (0, 3, 1, 2)
        assert tu.get_perm_when_transpose_axis_to_last_dim(3, -1) == (0, 1, 2)
        assert experimental.unittest is flow.unittest
        print("ok")
    """)
    done = run_onnxjob("run", script, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "ok" in done.stdout


def test_saved_model_pb2_imports_and_refuses_its_messages_by_line(tmp_path):
    # OneFlow's serving tests import saved_model_pb2 at the top even where they load the
    # model through InferenceSession.load_saved_model and never build the message
    script = write(tmp_path / "script.py", """
        from oneflow.core.serving import saved_model_pb2 as saved_model_pb
        import oneflow.compatible.single_client as flow
        assert callable(flow.serving.InferenceSession().load_saved_model)
        print("imported")
        saved_model_pb.SavedModel()
    """)
    done = run_onnxjob("run", script, cwd=tmp_path)
    assert "imported" in done.stdout, done.stderr
    assert done.returncode != 0
    assert "script.py:6" in done.stderr
    assert "saved_model_pb2.SavedModel is not provided" in done.stderr
    assert "load_saved_model" in done.stderr


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_worker_processes_of_a_run_script_import_oneflow_too(tmp_path, start_method):
    # spawn and forkserver workers (process pools, data loaders; Python 3.14's default on
    # Linux is forkserver) start a fresh interpreter that imports the script again
    script = write(tmp_path / "pool.py", f"""
        import multiprocessing
        import numpy as np
        import oneflow as flow
        import oneflow.typing as tp

        def batch(i):
            import oneflow.core.operator.op_conf_pb2 as op_conf
            assert flow.nn is __import__("onnxjob").nn and tp is __import__("onnxjob").typing
            return np.full((2,), i + op_conf.kNone, np.float).astype(np.float32)  # NumPy 1.x

        @flow.global_function()
        def double(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
            return x * 2

        if __name__ == "__main__":
            multiprocessing.set_start_method("{start_method}")
            with multiprocessing.Pool(1) as pool:
                batches = pool.map(batch, range(3))
            print("doubled", [float(double(b)[0]) for b in batches])
    """)
    done = run_onnxjob("run", script, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "doubled [0.0, 2.0, 4.0]" in done.stdout


def test_python_programs_a_run_script_starts_import_oneflow_too(tmp_path):
    # a launcher that runs `python train.py` for each setting, as with OneFlow installed
    write(tmp_path / "train.py", """
        import sys
        import numpy as np
        import oneflow as flow
        import oneflow.typing as tp
        import oneflow_api

        @flow.global_function()
        def scale(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
            return x * float(sys.argv[1])

        print("scaled", scale(np.ones(2, np.float32)).tolist())
    """)
    launcher = write(tmp_path / "sweep.py", """
        import subprocess
        import sys
        for factor in ("2", "3"):
            subprocess.run([sys.executable, "train.py", factor], check=True)
    """)
    done = run_onnxjob("run", launcher, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "scaled [2.0, 2.0]\nscaled [3.0, 3.0]" in done.stdout


def test_run_takes_a_folder_or_zip_with_a_main_as_python_does(tmp_path):
    import zipfile
    app = tmp_path / "app"
    app.mkdir()
    write(app / "helpers.py", "SCALE = 3.0\n")
    write(app / "__main__.py", """
        import sys
        import numpy as np
        import oneflow as flow
        import oneflow.typing as tp
        from helpers import SCALE

        @flow.global_function()
        def scale(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
            return x * SCALE

        print("argv", sys.argv[1:], "scaled", scale(np.ones(2, np.float32)).tolist())
    """)
    archive = tmp_path / "app.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for name in ("__main__.py", "helpers.py"):
            z.write(app / name, name)
    for target in (app, archive):
        done = run_onnxjob("run", str(target), "--flag", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert "argv ['--flag'] scaled [3.0, 3.0]" in done.stdout
    done = run_onnxjob("run", str(tmp_path), cwd=tmp_path)      # no __main__.py there
    assert done.returncode != 0 and "no such script" in done.stderr


def test_run_gives_scripts_the_names_numpy_and_python_removed_since_oneflow(tmp_path):
    """Programs written for OneFlow (NumPy 1.x, Python <= 3.9) use np.float / np.int /
    np.object dtypes, np.string_, np.NaN, np.asfarray, collections.Mapping and
    inspect.getargspec, np.fromstring's binary mode: under the runner they mean what they
    meant, with one warning per name at the line that first uses it; a library's feature
    test still sees the installed NumPy."""
    script = write(tmp_path / "old.py", """
        import collections
        import inspect
        from collections import Iterable
        import numpy as np
        import oneflow as flow
        import oneflow.typing as tp

        labels = np.array([1, 0], dtype=np.int)
        x = np.arange(6).reshape(2, 3).astype(np.float)

        @flow.global_function()
        def job(a: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
            return a * 2

        def f(a, b=2, *c, **d):
            pass
        print("dtypes", x.dtype, labels.dtype, np.dtype(np.object), np.dtype(np.string_))
        print("values", np.NaN != np.NaN, np.Inf, np.float_ is np.float64,
              np.asfarray([1, 2]).dtype, np.product([2, 3]), np.float is float,
              np.in1d([[1, 5]], [5]).tolist())
        print("python", isinstance({}, collections.Mapping), isinstance([], Iterable),
              tuple(inspect.getargspec(f)))
        print("job", job(x.astype(np.float32)).tolist())
        out = job(np.ones((2, 3), np.float32))
        print("metrics", {"acc": out.mean(), "row": list(out[0][:2])}, float(out[:1, :1]),
              "%.1f" % out.max(axis=None), int(np.argmax(out[:1], 1)))
        np.float
        print("bytes", np.fromstring("ab", dtype=np.int8).tolist(),
              np.fromstring(b"\\x01\\x00", np.uint8).tolist(),
              np.fromstring("1 2", sep=" ").tolist())
    """)
    done = run_onnxjob("run", script, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "dtypes float64 int64 object |S0" in out
    assert "values True inf True float64 6 True [False, True]" in out
    assert "python True True (['a', 'b'], 'c', 'd', (2,))" in out
    assert "job [[0.0, 2.0, 4.0], [6.0, 8.0, 10.0]]" in out
    # printed as NumPy 1.x printed them; one-element arrays taken from a result convert
    assert "metrics {'acc': 2.0, 'row': [2.0, 2.0]} 2.0 2.0 0" in out
    assert "bytes [97, 98] [1, 0] [1.0, 2.0]" in out        # (fromstring's binary mode)
    warned = [line for line in done.stderr.splitlines() if "UserWarning" in line]
    assert "old.py:9: UserWarning: numpy.int was removed in NumPy 1.24" in warned[1]
    assert sum("numpy.float was removed" in line for line in warned) == 1  # once, line 10
    assert any(line.startswith(f"{script}:10:") and "numpy.float " in line
               for line in warned), warned
    if sys.version_info >= (3, 11):       # (3.10 still has it)
        assert any("inspect.getargspec was removed in Python 3.11" in line for line in warned)
    # an installed library's feature test is answered by the installed NumPy
    library = write(tmp_path / "lib_probe.py", """
        import numpy as np, sysconfig
        code = compile("result = hasattr(np, 'float_')",
                       sysconfig.get_paths()["purelib"] + "/somelib/probe.py", "exec")
        scope = {"np": np}
        exec(code, scope)
        print("library sees float_:", scope["result"], "program sees:", hasattr(np, "float_"))
    """)
    done = run_onnxjob("run", library, cwd=tmp_path, timeout=300)
    assert "library sees float_: False program sees: True" in done.stdout, done.stderr


def test_importing_onnxjob_leaves_numpy_as_installed():
    done = subprocess.run([sys.executable, "-c", "import onnxjob, numpy, collections; "
                           "print(hasattr(numpy, 'float'), hasattr(collections, 'Mapping'))"],
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["False", "False"], done.stderr


def test_a_cpu_only_programs_default_placement_is_its_cpus():
    """cpu_device_num(n > 1) without gpu_device_num is a program for OneFlow's CPU-only
    build: its default placement, so its scope's device tag and its kernels (batch norm's
    biased moving variance), are the CPUs', as the n list elements it passes are."""
    import warnings
    import onnxjob as flow
    from onnxjob.frontend import scope
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        flow.config.cpu_device_num(2)
    desc = flow.current_scope().device_parallel_desc_symbol
    assert (desc.device_tag, desc.parallel_num) == ("cpu", 2)
    assert scope.oneflow_places_on_cpu(None)
    flow.config.gpu_device_num(1)
    assert flow.current_scope().device_parallel_desc_symbol.device_tag == "gpu"

"""OneFlow 0.5's smaller public names: flow.sysconfig, flow.distributed, flow.profiler,
flow.util, flow.sbp, flow.scope / flow.experimental.scope, flow.deprecated, flow.system,
the top-level constants and helpers, the image_* aliases, and the names onnxjob refuses
with a reason."""
import os

import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.compat import install_oneflow_alias, uninstall_oneflow_alias
from onnxjob.errors import TraceError, UnsupportedAPIError
from onnxjob.frontend.refusals import REASONS

THIS_FILE = os.path.basename(__file__)


def test_sysconfig_describes_onnxruntime():
    import onnxruntime
    cuda = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    assert flow.sysconfig.with_cuda() is cuda
    version = flow.sysconfig.get_cuda_version()
    assert isinstance(version, int) and (version >= 1000 if cuda else version == 0)
    assert flow.sysconfig.with_xla() is False
    assert flow.sysconfig.has_rpc_backend_grpc() is False
    assert flow.sysconfig.has_rpc_backend_local() is True


def test_distributed_reads_the_launcher_environment(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert (flow.distributed.get_rank(), flow.distributed.get_world_size(),
            flow.distributed.get_local_rank(), flow.distributed.is_multi_client()) == (0, 1, 0,
                                                                                     False)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert (flow.distributed.get_rank(), flow.distributed.get_world_size(),
            flow.distributed.get_local_rank(), flow.distributed.is_multi_client()) == (3, 4, 1,
                                                                                     True)


def test_profiler_ranges_nest_and_markers_keep_values():
    flow.profiler.range_push("outer")
    flow.profiler.range_push("inner")
    assert flow.profiler.range_pop() == "inner"
    assert flow.profiler.range_pop() == "outer"
    with pytest.raises(RuntimeError, match="no range is open"):
        flow.profiler.range_pop()

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        y = flow.profiler.nvtx_start(x, mark_prefix="fwd")
        return flow.profiler.nvtx_end(y * 2, mark_prefix="fwd")

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(job(x), x * 2)


def test_unique_str_and_constants():
    names = {flow.util.unique_str("Op_") for _ in range(50)}
    assert len(names) == 50 and all(n.startswith("Op_") for n in names)
    assert flow.INVALID_SPLIT_AXIS == -22
    assert isinstance(flow.float32, flow.dtype) and isinstance(flow.int8, flow.dtype)
    assert not isinstance(np.float32, flow.dtype)


def test_sbp_descriptors():
    assert str(flow.sbp.split(1)) == "S(1)" and flow.sbp.split(1) == flow.sbp.split(1)
    assert flow.sbp.split(0) != flow.sbp.split(1)
    assert str(flow.sbp.broadcast) == "B" and str(flow.sbp.partial_sum) == "P"
    with pytest.raises(AssertionError):
        flow.sbp.split(1.0)


def test_hierarchical_parallel_cast_keeps_values_and_checks_signatures():
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((4, 2))) -> tp.Numpy:
        y = flow.hierarchical_parallel_cast(x, nd_sbp=["S(0)", flow.sbp.broadcast])
        return flow.hierarchical_parallel_cast(y, nd_sbp=[flow.distribute.split(1)],
                                               grad_mode="manual", grad_nd_sbp=["B"])

    x = np.random.rand(4, 2).astype(np.float32)
    np.testing.assert_array_equal(job(x), x)
    flow.clear_default_session()

    @flow.global_function()
    def bad(x: tp.Numpy.Placeholder((4, 2))) -> tp.Numpy:
        return flow.hierarchical_parallel_cast(x, nd_sbp=["split"])

    with pytest.raises(TraceError, match="not an SBP signature"):
        bad(x)


def test_current_global_function_desc_inside_jobs():
    seen = {}
    config = flow.FunctionConfig()
    config.enable_inplace(False)

    @flow.global_function(type="predict", function_config=config)
    def predict(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        desc = flow.current_global_function_desc()
        seen["predict"] = (desc.IsTrainable(), desc.HasAttr("enable_inplace"),
                           desc.enable_inplace)
        return x + 1

    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        seen["train"] = flow.current_global_function_desc().IsTrainable()
        w = flow.get_variable("w", (2,), initializer=flow.ones_initializer())
        loss = flow.math.reduce_sum(w * x)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)
        return loss

    predict(np.ones(2, np.float32))
    train(np.ones(2, np.float32))
    assert seen == {"predict": (False, True, False), "train": True}
    with pytest.raises(TraceError, match="inside a job function"):
        flow.current_global_function_desc()


def test_empty_initializer_and_system_assign():
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        v = flow.get_variable("v", (3,), initializer=flow.empty_initializer())
        out = v + 0
        assert flow.system.assign(v, x) is v
        return out

    x = np.array([1, 2, 3], np.float32)
    np.testing.assert_array_equal(job(x), np.zeros(3))
    np.testing.assert_array_equal(job(x * 0), x)


def test_inter_job_reuse_mem_strategy_checks_its_argument():
    flow.inter_job_reuse_mem_strategy("reuse_mem_priority")
    flow.inter_job_reuse_mem_strategy("custom_parallelism", job_name_groups=[["a", "b"]])
    with pytest.raises(ValueError, match="must be one of"):
        flow.inter_job_reuse_mem_strategy("fastest")


def test_scope_helpers():
    # OneFlow's default placement, wherever onnxjob runs the job
    assert flow.scope.current_scope().device_parallel_desc_symbol.device_tag == "gpu"
    assert flow.scope.current_scope_attrs()["checkpointing"] is False
    with flow.experimental.scope.config(checkpointing=True, pipeline_stage_id_hint=1):
        attrs = flow.scope.current_scope_attrs()
        assert attrs["checkpointing"] is True and attrs["pipeline_stage_id_hint"] == 1
    assert flow.scope.current_scope_attrs()["checkpointing"] is False
    with pytest.raises(AssertionError, match="unknown scope attribute"):
        flow.experimental.scope.config(remat=True)


def test_deprecated_names():
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        with flow.deprecated.variable_scope("block"):
            w = flow.get_variable("w", (2,), initializer=flow.ones_initializer())
        return x * w

    np.testing.assert_array_equal(job(np.full(2, 3, np.float32)), [3, 3])
    assert "block-w" in flow.get_all_variables()
    assert flow.deprecated.nn.Module is flow.nn.Module
    assert flow.autograd.no_grad is flow.no_grad


def test_image_aliases_are_the_flow_image_ops():
    for name in ("batch_align", "decode", "flip", "normalize", "random_crop", "resize",
                 "target_resize"):
        assert getattr(flow, f"image_{name}") is getattr(flow.image, name)


def test_top_level_op_families_are_the_flow_names():
    """Each op family's __all__ is what flow.<name> gives (onnxjob/__init__.py imports
    them by name), and no name is in two families."""
    import importlib
    seen = {}
    for family in ("casts", "creation", "indexing", "linalg", "padding", "selection",
                   "shapes", "slicing"):
        module = importlib.import_module(f"onnxjob.ops.{family}")
        for name in module.__all__:
            assert name not in seen, f"{name} is in {seen.get(name)} and {family}"
            seen[name] = family
            assert getattr(flow, name) is getattr(module, name), f"flow.{name}"
    assert flow.linalg.matmul is flow.matmul
    assert flow.experimental.unique_with_counts is importlib.import_module(
        "onnxjob.ops.selection").unique_with_counts


@pytest.mark.parametrize("dotted", sorted(f"{ns}.{name}" for ns, names in REASONS.items()
                                          for name in names))
def test_refused_names_say_why(dotted):
    namespace, name = dotted.rsplit(".", 1)
    obj = flow
    for part in namespace.split(".")[1:]:
        obj = getattr(obj, part)
    with pytest.raises(UnsupportedAPIError) as info:
        getattr(obj, name)
    message = str(info.value)
    assert f"{dotted} is not provided by onnxjob" in message
    assert REASONS[namespace][name] in message
    assert os.path.basename(__file__) in message   # the user's line
    assert not hasattr(obj, name)


def test_namespaces_import_under_the_alias():
    install_oneflow_alias()
    try:
        import oneflow.compatible.single_client.sysconfig as sysconfig
        import oneflow.distributed as distributed
        from oneflow.compatible.single_client import model
        assert sysconfig is flow.sysconfig and distributed is flow.distributed
        assert model.Model is flow.Model
    finally:
        uninstall_oneflow_alias()


# -- every OneFlow namespace refuses an unknown name naming the line -----------------------

_ONNXJOB_PACKAGES = {"compat", "dtypes", "eager", "errors", "frontend", "graph", "io", "ops",
                     "passes", "runtime", "settings", "source_info", "launch", "spawned_ranks",
                     "initializers"}   # onnxjob.frontend.initializers (OneFlow has no such)


def _oneflow_namespaces():
    """flow's namespaces: its modules less onnxjob's own packages, the flow.config /
    flow.env objects and the small namespaces (ApiNamespace), with the small namespaces
    nested in them."""
    import types
    from onnxjob.frontend.namespaces import ApiNamespace

    def small(v):
        return isinstance(v, ApiNamespace) or type(v).__name__ in ("_ConfigModule",
                                                                   "_EnvModule")
    found = {}
    for name, value in vars(flow).items():
        module = isinstance(value, types.ModuleType) and value.__name__.startswith("onnxjob.")
        if name.startswith("_") or name in _ONNXJOB_PACKAGES or not (module or small(value)):
            continue
        found[f"flow.{name}"] = value
        for inner, v in vars(value).items():
            if not inner.startswith("_") and small(v):
                found[f"flow.{name}.{inner}"] = v
    return found


def test_every_namespace_refuses_an_unknown_name_naming_the_line():
    """OneFlow <= 0.4 programs reach names that 0.5 dropped (flow.config.
    save_downloaded_file_to_local_fs, ...): whatever namespace they are looked up in
    (module, flow.config / flow.env object, small namespace), the error is
    UnsupportedAPIError with the user's line, never a TypeError from onnxjob's code."""
    spaces = _oneflow_namespaces()
    for must in ("flow.config", "flow.env", "flow.typing", "flow.unittest", "flow.math",
                 "flow.train", "flow.config.collective_boxing"):
        assert must in spaces
    for path, space in spaces.items():
        with pytest.raises(UnsupportedAPIError, match=rf"{THIS_FILE}:\d+: .*no_such_name"):
            getattr(space, "no_such_name")
        assert not hasattr(space, "no_such_name")


def test_names_oneflow_0_2_to_0_4_exported():
    """Names of the older generations that 0.5 renamed or dropped."""
    assert flow.summary.Hparam is flow.summary.HParam
    assert flow.quantization.moving_average_min_maxObserver is \
        flow.quantization.moving_average_min_max_observer
    flow.config.save_downloaded_file_to_local_fs(True)     # an I/O flag: accepted, no effect
    for name in ("init_worker", "delete_worker"):
        with pytest.raises(UnsupportedAPIError, match=rf"{THIS_FILE}:\d+: .*multi-node"):
            getattr(flow.deprecated, name)

    flow.clear_default_session()
    config = flow.FunctionConfig()
    config.default_logical_view(flow.scope.mirrored_view())

    @flow.global_function(function_config=config)
    def job(x=flow.MirroredTensorListDef((2, 5, 4), dtype=flow.float)) -> tp.ListListNumpy:
        return flow.tensor_buffer_to_tensor_list(
            flow.tensor_list_to_tensor_buffer(x), shape=(5, 4), dtype=flow.float)

    a = np.arange(6, dtype=np.float32).reshape(1, 3, 2)
    b = np.ones((1, 2, 2), np.float32)
    out = job([[a, b]])
    np.testing.assert_array_equal(out[0][0], a)
    np.testing.assert_array_equal(out[0][1], b)

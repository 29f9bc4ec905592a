"""Every public function of the flow namespaces called with OneFlow's documented argument
forms inside a job: plain inputs, and `None` for each parameter whose default is None
(OneFlow reads None there as "the default"). What may come out is a result or one of the
errors OneFlow's users meet (onnxjob's own, naming the line; an AssertionError as OneFlow
asserts); never a raw TypeError / AttributeError / KeyError / IndexError raised inside
onnxjob."""
import inspect

import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.errors import OnnxJobError

NAMESPACES = {"flow": flow, "flow.math": flow.math, "flow.nn": flow.nn,
              "flow.layers": flow.layers, "flow.random": flow.random}
RAW = (TypeError, AttributeError, KeyError, IndexError, NameError, ZeroDivisionError)
# made outside a job, or taking no blob: not called here (they have tests of their own)
NOT_OPS = {"global_function", "clear_default_session", "sync_default_session", "watch",
           "watch_diff", "load", "load_variables", "get_all_variables", "save", "export",
           "find_or_create_module", "current_global_function_desc", "current_scope",
           "current_resource", "current_machine_id", "inter_job_reuse_mem_strategy",
           "manual_seed", "no_grad", "eager_execution_enabled", "Model", "Size",
           "convert_oneflow_dtype_to_numpy_dtype", "FunctionConfig", "ExecutionConfig",
           "function_config", "FixedTensorDef", "MirroredTensorDef", "user_op_builder",
           "consistent_user_op_builder", "user_op_module_builder",
           "consistent_user_op_module_builder", "assign", "get_variable", "empty_initializer"}

FLOAT_ARGS = {"x", "input", "a", "b", "input_tensor", "value", "params", "like", "logits",
              "prediction", "inputs", "input_blob", "tensor", "data", "y", "images", "image",
              "features", "labels_float", "condition", "updates", "ref", "lhs", "rhs"}
INT_ARGS = {"labels", "indices", "label", "segment_ids"}


def _argument(name, x, idx):
    """A value for required parameter `name`, or raise KeyError (not synthesized)."""
    if name in FLOAT_ARGS:
        return x
    if name in INT_ARGS:
        return idx
    return {"shape": [2, 3], "axis": 0, "k": 1, "units": 2, "filters": 2, "ksize": 1,
            "strides": 1, "padding": "VALID", "rate": 0.5, "depth": 3, "dtype": flow.float,
            "perm": [1, 0], "num_segments": 3, "kernel_size": 1, "size": [1, 1],
            "begin": [0, 0], "paddings": [[0, 0], [0, 0]], "expand_size": [2, 3],
            "clip_value_min": 0.0, "clip_value_max": 1.0, "multiples": [1, 1],
            "num_or_size_splits": 1, "split_size_or_sections": 1, "instance_shape": [3]}[name]


def _cases():
    out = []
    for space, module in NAMESPACES.items():
        for name in sorted(dir(module)):
            fn = getattr(module, name, None)
            if name.startswith("_") or name in NOT_OPS or not inspect.isfunction(fn):
                continue
            params = inspect.signature(fn).parameters.values()
            required = [p.name for p in params if p.default is p.empty and
                        p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            nones = [p.name for p in params if p.default is None]
            out.append(pytest.param(space, name, required, nones, id=f"{space}.{name}"))
    return out


def _call(fn, required, extra):
    calls = {}

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2, 3)),
            idx: tp.Numpy.Placeholder((2,), dtype=flow.int32)) -> tp.Numpy:
        args = [_argument(n, x, idx) for n in required]
        calls["result"] = fn(*args, **extra)
        return x

    job(np.ones((2, 3), np.float32), np.zeros(2, np.int32))
    return calls.get("result")


@pytest.mark.parametrize("space,name,required,nones", _cases())
def test_documented_forms_raise_no_raw_python_error(space, name, required, nones):
    fn = getattr(NAMESPACES[space], name)
    try:
        [_argument(n, None, None) for n in required]
    except KeyError as e:
        pytest.skip(f"no generic argument for parameter {e}")
    forms = [{}] + [{p: None} for p in nones]
    for extra in forms:
        flow.clear_default_session()
        try:
            _call(fn, required, extra)
        except (OnnxJobError, AssertionError, NotImplementedError):
            pass            # onnxjob's errors name the line; OneFlow asserts
        except RAW as e:
            pytest.fail(f"{space}.{name}(**{extra}) raised a raw {type(e).__name__}: {e}")
        except (ValueError, RuntimeError):
            pass            # onnxjob's value checks (as OneFlow's) and run-time errors

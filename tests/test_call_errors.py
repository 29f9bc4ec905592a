"""Bad input: the errors of spec §2.2 / §2.5, with messages that say what was wrong."""
import os
import typing
from typing import Dict, Tuple

import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.errors import ConcreteBlobError, JobArgumentError, TraceError
from onnxjob.runtime.session import default_session

THIS_FILE = os.path.basename(__file__)


def job_numpy():
    @flow.global_function()
    def foo(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        return x
    return foo


def test_wrong_shape_names_parameter_shapes_and_caller_line():
    foo = job_numpy()
    with pytest.raises(AssertionError) as e:
        foo(np.zeros((3, 3), np.float32))
    assert isinstance(e.value, JobArgumentError)
    msg = str(e.value)
    assert "'x'" in msg and "(3, 3)" in msg and "(2, 3)" in msg and THIS_FILE in msg


def test_not_an_ndarray():
    foo = job_numpy()
    with pytest.raises(AssertionError, match="numpy.ndarray"):
        foo([[0.0] * 3] * 2)


def test_a_fed_array_is_cast_to_the_placeholders_dtype_as_oneflow_does():
    """OneFlow force-casts a fed array into its placeholder (pybind11's array_t, NumPy's
    unsafe cast): float64 images, int64 masks, booleans and float labels all convert; a
    float fed to an integer placeholder loses its fraction, with one warning per argument;
    arrays of objects or strings convert where their elements do (a mixed table's
    DataFrame.values sliced to numbers, a CSV read as text); others are refused."""
    foo = job_numpy()

    @flow.global_function()
    def labels(y: tp.Numpy.Placeholder((3,), dtype=flow.int32)) -> tp.Numpy:
        return y
    out = foo(np.ones((2, 3), np.float64))
    assert out.dtype == np.float32 and np.all(out == 1)
    mask = np.random.default_rng(0).integers(0, 2, size=(2, 3))     # int64
    out = foo(mask)
    assert out.dtype == np.float32 and np.array_equal(out, mask)
    out = foo(np.array([[True, False, True]] * 2))
    assert out.dtype == np.float32 and np.array_equal(out, [[1, 0, 1]] * 2)
    assert labels(np.arange(3, dtype=np.uint8)).dtype == np.int32
    with pytest.warns(UserWarning, match="dropping fractions") as caught:
        np.testing.assert_array_equal(labels(np.array([1.0, 2.7, -1.5])), [1, 2, -1])
    assert all(THIS_FILE in w.filename for w in caught)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")      # once per argument
        np.testing.assert_array_equal(labels(np.array([0.5, 3.0, 4.9])), [0, 3, 4])
    table = np.array([["a", 1, 2.5], ["b", 3, 4.25]], dtype=object)
    out = foo(np.concatenate([table[:, 1:], table[:, 1:2]], axis=1))
    assert out.dtype == np.float32 and np.array_equal(out, [[1, 2.5, 1], [3, 4.25, 3]])
    np.testing.assert_array_equal(labels(np.array(["4", "-2", "7"])), [4, -2, 7])
    with pytest.raises(AssertionError, match="does not convert"):
        labels(np.array(["a", "b", "c"]))
    with pytest.raises(AssertionError, match="does not convert"):
        labels(np.array([1, None, 2], dtype=object))


def test_non_contiguous_input_is_accepted_and_copied():
    foo = job_numpy()
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    view = base[:2, 1:]
    assert np.array_equal(foo(view), view)


def test_argument_count_and_keywords():
    foo = job_numpy()
    with pytest.raises(AssertionError):
        foo()
    with pytest.raises(TypeError):
        foo(x=np.zeros((2, 3), np.float32))


def test_tuple_argument_type_and_length():
    @flow.global_function()
    def foo(x: Tuple[tp.Numpy.Placeholder((2,)), tp.Numpy.Placeholder((2,))]) -> tp.Numpy:
        return x[0]

    with pytest.raises(AssertionError, match="type\\(arg_ndarray\\)"):
        foo(np.zeros(2, np.float32))
    with pytest.raises(AssertionError, match="3 v.s. 2"):
        foo((np.zeros(2, np.float32),) * 3)


def test_list_numpy_checks():
    config = flow.FunctionConfig()
    config.default_logical_view(flow.scope.mirrored_view())

    @flow.global_function(function_config=config)
    def foo(x: tp.ListNumpy.Placeholder((4,))) -> tp.ListNumpy:
        return x

    with pytest.raises(AssertionError, match="list of 1"):
        foo(np.zeros(4, np.float32))
    with pytest.raises(AssertionError, match="more than"):
        foo([np.zeros(5, np.float32)])
    with pytest.raises(AssertionError, match="rank"):
        foo([np.zeros((2, 2), np.float32)])


def test_placeholder_shape_must_be_tuple():
    with pytest.raises(AssertionError, match="shape should be a tuple"):
        tp.Numpy.Placeholder([2, 3])


@pytest.mark.parametrize("ann", [tp.Numpy, np.ndarray, Dict[str, tp.Numpy.Placeholder((2,))]])
def test_invalid_parameter_annotation(ann):
    with pytest.raises(NotImplementedError, match="invalid parameter annotation"):
        @flow.global_function()
        def foo(x: ann) -> tp.Numpy:
            return x


def test_var_args_rejected():
    with pytest.raises(AssertionError, match=r"no parameters like \*args"):
        @flow.global_function()
        def foo(*x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
            return x


@pytest.mark.parametrize("ann,exc,msg", [
    (int, NotImplementedError, "invalid return annotation"),
    (np.ndarray, NotImplementedError, "invalid return annotation"),
    (tp.Callback[None], NotImplementedError, "invalid return annotation"),
    (typing.Tuple, AssertionError, r"T in typing.Tuple\[T, ...\] cannot be omitted"),
    (typing.List, AssertionError, r"T in typing.List\[T\] cannot be omitted"),
    (typing.Dict, AssertionError, r"\(K, V\) in typing.Dict\[K,V\] cannot be omitted"),
    (tp.Callback, AssertionError, r"T in oneflow.typing.Callback\[T\] cannot be omitted"),
    (tp.Bundle[int], AssertionError, r"T in oneflow.typing.Bundle\[T\] must be one of"),
])
def test_invalid_return_annotations(ann, exc, msg):
    with pytest.raises(exc, match=msg):
        @flow.global_function()
        def foo(x: tp.Numpy.Placeholder((2,))) -> ann:
            return x


@pytest.mark.parametrize("ann,ret,msg", [
    (None, lambda x: x, "does not matched return annotation"),
    (Tuple[tp.Numpy], lambda x: [x], "does not matched return annotation"),
    (Tuple[tp.Numpy], lambda x: (x, x), "length compare: 2 v.s. 1"),
    (tp.Numpy, lambda x: [x], "type\\(ret\\)"),
    (Dict[str, tp.Numpy], lambda x: {1: x}, "type of k"),
])
def test_return_value_mismatch_raises_at_first_call(ann, ret, msg):
    @flow.global_function()
    def foo(x: tp.Numpy.Placeholder((2,))) -> ann:
        return ret(x)

    with pytest.raises(AssertionError, match=rf"{THIS_FILE}:[0-9]+: .*{msg}"):
        foo(np.zeros(2, np.float32))


def test_an_unannotated_job_returning_a_python_value_names_the_job_and_the_place():
    flow.clear_default_session()

    @flow.global_function()
    def pretrain(x: tp.Numpy.Placeholder((2,))):
        return {"total_loss": x, "nsp_loss": 0.0}   # OneFlow refuses it too

    with pytest.raises(NotImplementedError,
                       match=rf"{THIS_FILE}:[0-9]+: job pretrain returns Blobs .*"
                             r"got float 0.0 at return value\['nsp_loss'\]"):
        pretrain(np.zeros(2, np.float32))


def test_dynamic_blob_as_numpy_return():
    config = flow.FunctionConfig()
    config.default_logical_view(flow.scope.mirrored_view())

    @flow.global_function(function_config=config)
    def foo(x: tp.ListNumpy.Placeholder((2,))) -> tp.Numpy:
        return x

    with pytest.raises(AssertionError, match="only fixed shaped blob"):
        foo([np.zeros(2, np.float32)])


def test_mixed_annotations():
    with pytest.raises(NotImplementedError, match="should be annotated"):
        @flow.global_function()
        def foo(x: tp.Numpy.Placeholder((2,)), y=flow.FixedTensorDef((2,))) -> tp.Numpy:
            return x


def test_bad_type_and_no_parentheses():
    with pytest.raises(AssertionError):
        flow.global_function("eval")
    with pytest.raises(AssertionError):
        @flow.global_function
        def foo(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
            return x


def test_no_new_job_after_start_and_duplicates():
    first = job_numpy()
    foo = job_numpy()  # the same name again: replaces the first, as in OneFlow
    assert list(default_session().jobs) == ["foo"]
    with pytest.raises(RuntimeError, match="was replaced"):
        first(np.zeros((2, 3), np.float32))
    flow.clear_default_session()
    # a job of the cleared session, with no job of its name in the new one: said so
    with pytest.raises(RuntimeError, match=r"test_call_errors\.py:\d+: job function 'foo' "
                                           "defined at .* belongs to a session that "
                                           r"flow\.clear_default_session\(\) ended"):
        foo(np.zeros((2, 3), np.float32))
    foo = job_numpy()
    foo(np.zeros((2, 3), np.float32))
    with pytest.raises(NotImplementedError, match="no avaliable function found"):
        flow.global_function()
    assert flow.config.gpu_device_num(2) is False


def test_shape_error_names_user_line():
    @flow.global_function()
    def foo(x: tp.Numpy.Placeholder((2, 3)), y: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        return x + y  # line of the error

    with pytest.raises(TraceError) as e:
        foo(np.zeros((2, 3), np.float32), np.zeros(4, np.float32))
    assert THIS_FILE in str(e.value) and "do not broadcast" in str(e.value)


def test_blob_in_python_control_flow():
    # OneFlow's lazy blob defines no __bool__: any blob is true, also a comparison's (the
    # spec's "not usable as booleans" is stricter than OneFlow); that trap warns, naming
    # the line. len() and iteration raise TypeError, as for OneFlow's blobs.
    @flow.global_function()
    def foo(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        if x > 0:
            return x + 1
        return x

    with pytest.warns(UserWarning, match=THIS_FILE):
        np.testing.assert_array_equal(foo(np.zeros(2, np.float32)), [1, 1])
    flow.clear_default_session()

    @flow.global_function()
    def bar(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        return x[len(x)]

    with pytest.raises(ConcreteBlobError, match=THIS_FILE) as e:
        bar(np.zeros(2, np.float32))
    assert isinstance(e.value, TypeError)


def test_train_job_without_optimizer_and_predict_job_with_minimize():
    @flow.global_function(type="train")
    def t(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        return x * flow.get_variable("w", (2,), initializer=flow.ones_initializer())

    with pytest.raises(TraceError, match="has no optimizer"):
        t(np.zeros(2, np.float32))
    flow.clear_default_session()

    @flow.global_function()
    def p(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        y = x * flow.get_variable("w", (2,), initializer=flow.ones_initializer())
        flow.optimizer.SGD(0.1).minimize(y)
        return y

    # as OneFlow (minimize sets train_conf, a oneof with predict_conf), the job trains
    np.testing.assert_array_equal(p(np.float32([1, 2])), [1, 2])
    np.testing.assert_allclose(flow.get_all_variables()["w"].numpy(), [0.95, 0.9])


def test_function_config_rejects_unknown_flags_accepts_ignored():
    config = flow.function_config()
    config.default_data_type(flow.float)
    config.enable_cudnn(True)
    config.default_placement_scope(flow.scope.placement("cpu", "0:0"))
    with pytest.raises(AssertionError):
        config.no_such_flag(True)
    with pytest.raises(AssertionError):
        config.default_logical_view("mirrored")


def test_variable_reuse_false_collides():
    @flow.global_function()
    def foo(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        a = flow.layers.dense(x, 4, name="d")
        return flow.layers.dense(a, 4, name="d")

    with pytest.raises(AssertionError, match="already exists"):
        foo(np.zeros((2, 3), np.float32))


def test_a_layer_s_activation_that_is_no_function_is_warned_at_the_line():
    """A program passing an initializer as `activation` gets a warning at its line saying
    what was expected, and no activation, as OneFlow's layers apply only a callable one."""
    flow.clear_default_session()

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        return flow.layers.dense(x, 4, activation=flow.zeros_initializer())

    with pytest.warns(UserWarning, match="is not a function") as caught:
        job(np.ones((2, 3), np.float32))
    assert any(THIS_FILE in w.filename for w in caught)


def test_layers_without_a_name_are_named_apart_as_oneflow_0_1_0_named_them():
    """OneFlow 0.1.0-0.1.4 gave each layer called without name= a name of its own (its
    documentation's MLP stacks two unnamed dense layers); later releases name them all
    'Dense' and refuse the second. onnxjob accepts the program: the first keeps the default
    name (the variable names of later releases' checkpoints), the next ones are 'Dense_1',
    ..., with one warning naming the line; a predict job that repeats the layers shares
    the variables, name for name. A name the program gives twice still raises."""
    flow.clear_default_session()

    def mlp(x):
        hidden = flow.layers.dense(x, 4, activation=flow.nn.relu, name=None,
                                   kernel_initializer=flow.random_normal_initializer())
        return flow.layers.dense(hidden, 2, kernel_initializer=flow.ones_initializer())

    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        loss = flow.math.reduce_mean(mlp(x))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                           momentum=0).minimize(loss)
        return loss

    @flow.global_function()
    def predict(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        return mlp(x)

    x = np.ones((2, 3), np.float32)
    with pytest.warns(UserWarning, match="named 'Dense_1'") as caught:
        train(x)
    assert [os.path.basename(w.filename) for w in caught
            if "Dense_1" in str(w.message)] == [THIS_FILE]
    variables = flow.get_all_variables()
    assert {"Dense-bias", "Dense-weight", "Dense_1-bias", "Dense_1-weight"} <= set(variables)
    assert not any(name.startswith("Dense_2") for name in variables)
    assert variables["Dense-weight"].shape == (4, 3)
    assert variables["Dense_1-weight"].shape == (2, 4)
    w1, b1, w2, b2 = (variables[n].numpy() for n in (
        "Dense-weight", "Dense-bias", "Dense_1-weight", "Dense_1-bias"))
    expected = np.maximum(x @ w1.T + b1, 0) @ w2.T + b2
    np.testing.assert_allclose(predict(x), expected, rtol=1e-5, atol=1e-6)
    flow.clear_default_session()


@pytest.mark.parametrize("export", [
    lambda target, tmp: flow.export(target, str(tmp / "m.onnx")),
    lambda target, tmp: flow.onnx.export(target, str(tmp), str(tmp / "m.onnx")),
])
def test_exporting_something_that_is_not_a_job_names_it_and_the_jobs(tmp_path, export):
    foo = job_numpy()
    foo(np.zeros((2, 3), np.float32))
    flow.checkpoint.save(str(tmp_path / "weights"))
    for target in (lambda x: x, "no_such_job"):
        with pytest.raises(TraceError, match=rf"{THIS_FILE}:\d+: expected a job function .* "
                                             r"this session's jobs: \['foo'\]"):
            export(target, tmp_path / "weights")
    export(foo, tmp_path / "weights")
    export("foo", tmp_path / "weights")          # a job's name is taken as the job


def test_an_op_that_fails_on_a_call_s_values_names_the_job_op_and_line():
    """An index out of range of gather_nd (OneFlow reads past the data there; flow.gather
    gives zeros) fails inside onnxruntime at run time: the error names the job, the op
    and the line of the body that made it, and the session goes on."""
    from onnxjob.errors import JobRunError

    def body(i: tp.Numpy.Placeholder((2, 1), dtype=flow.int32)) -> tp.Numpy:
        table = flow.constant(1.0, shape=(4, 3))
        return flow.gather_nd(table, i)      # the line the error names
    line = body.__code__.co_firstlineno + 2
    lookup = flow.global_function()(body)

    with pytest.raises(JobRunError) as caught:
        lookup(np.array([[1], [9]], np.int32))
    message = str(caught.value)
    assert f"{THIS_FILE}:{line}: job 'body': GatherND failed on this call's values" in message
    assert "invalid index" in message      # onnxruntime's own words follow
    np.testing.assert_array_equal(lookup(np.array([[1], [3]], np.int32)), np.ones((2, 3)))


def test_concat_of_two_dtypes_says_so():
    flow.clear_default_session()

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2, 3)),
            i: tp.Numpy.Placeholder((2, 3), dtype=flow.int32)) -> tp.Numpy:
        return flow.concat([x, i], axis=0)

    with pytest.raises(TraceError, match="float32 and int32 values") as e:
        job(np.ones((2, 3), np.float32), np.zeros((2, 3), np.int32))
    assert THIS_FILE in str(e.value)


def test_a_switch_given_a_string_is_refused_at_the_line():
    """OneFlow sets its switches as protobuf bools, which refuse a string; taken as given,
    "False" would have turned mixed precision on."""
    config = flow.function_config()
    with pytest.raises(TypeError, match=f"{THIS_FILE}:.*enable_auto_mixed_precision takes a "
                                        "bool, got the string 'False'"):
        config.enable_auto_mixed_precision("False")
    config.enable_auto_mixed_precision(False)
    config.enable_inplace(1)
    assert config.flags["enable_auto_mixed_precision"] is False

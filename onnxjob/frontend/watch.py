"""flow.watch / flow.watch_diff: a handler receives a value (or its gradient) every run."""
import inspect


from onnxjob import typing as tp
from onnxjob.compat.generations import renamed_keywords, written_for_0_4
from onnxjob.compat.zero_d_results import host_results
from onnxjob.frontend.results import LocalBlob
from onnxjob.source_info import user_location
from onnxjob.graph.tracer import current_builder


def _make_handler(blob, handler_or_prompt):
    """A function of the per-device values that calls the user's handler as OneFlow does
    (0-d values as ZeroDResults, compat/zero_d_results.py)."""
    handler = _values_handler(blob, handler_or_prompt)
    as_vector = written_for_0_4()     # (OneFlow <= 0.4's (1,) for a 0-d value)
    return lambda values: handler(host_results(values, as_vector))


def _values_handler(blob, handler_or_prompt):
    if handler_or_prompt is None or isinstance(handler_or_prompt, str):
        prompt = handler_or_prompt

        def printer(values):
            # as OneFlow's default handler: the prompt when one is given ("" an empty
            # line), then the value, a dynamic (mirrored) Blob's as its list (ListNumpy)
            if prompt is not None:
                print(str(prompt))
            print(values[0] if len(values) == 1 and not blob.is_dynamic else list(values))
        return printer
    params = list(inspect.signature(handler_or_prompt).parameters.values())
    assert len(params) == 1, "watch callback should accept only one parameter"
    ann = params[0].annotation
    if ann is inspect.Parameter.empty:
        return lambda values: handler_or_prompt(LocalBlob(values, blob.is_dynamic))
    if ann is tp.Numpy:
        if blob.is_dynamic:
            raise AssertionError(
                "only fixed shaped blob compatible to oneflow.typing.Numpy. you can change "
                "annotation to oneflow.typing.ListNumpy or oneflow.typing.ListListNumpy")
        return lambda values: handler_or_prompt(values[0])
    if ann is tp.ListNumpy:
        return lambda values: handler_or_prompt(list(values))
    if ann is tp.ListListNumpy:
        return lambda values: handler_or_prompt([list(v) for v in values])
    raise NotImplementedError(
        f"invalid watch callback paremeter annotation {ann} found. candidate annotations: "
        "oneflow.typing.Numpy, oneflow.typing.ListNumpy, oneflow.typing.ListListNumpy")


@renamed_keywords(blob_watched="blob")
def watch(blob, handler_or_prompt=None):
    """Call the handler with `blob`'s value after every run of the job."""
    builder = current_builder("flow.watch")
    builder.watches.append((blob, _make_handler(blob, handler_or_prompt), False, user_location()))


@renamed_keywords(blob_watched="blob")
def watch_diff(blob, handler_or_prompt=None):
    """Call the handler with d(sum of loss)/d(blob) after every run of the train job.

    Under a loss scale the value is multiplied by the step's scale, as OneFlow shows it (its
    watcher reads the backward's diff, before the variable gradients are unscaled)."""
    builder = current_builder("flow.watch_diff")
    builder.watches.append((blob, _make_handler(blob, handler_or_prompt), True, user_location()))

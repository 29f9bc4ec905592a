"""flow.watch / flow.watch_diff: a handler receives a value (or its gradient) every run."""
import inspect


from . import typing as tp
from .results import LocalBlob
from .source_info import user_location
from .tracer import current_builder


def _make_handler(blob, handler_or_prompt):
    if handler_or_prompt is None or isinstance(handler_or_prompt, str):
        prompt = handler_or_prompt

        def printer(value):
            if prompt:
                print(prompt)
            print(value)
        return printer
    params = list(inspect.signature(handler_or_prompt).parameters.values())
    assert len(params) == 1, "watch callback should accept only one parameter"
    ann = params[0].annotation
    if ann is inspect.Parameter.empty:
        return lambda v: handler_or_prompt(LocalBlob(v))
    if ann is tp.Numpy:
        if blob.is_dynamic:
            raise AssertionError(
                "only fixed shaped blob compatible to oneflow.typing.Numpy. you can change "
                "annotation to oneflow.typing.ListNumpy or oneflow.typing.ListListNumpy")
        return handler_or_prompt
    if ann is tp.ListNumpy:
        return lambda v: handler_or_prompt([v])
    if ann is tp.ListListNumpy:
        return lambda v: handler_or_prompt([list(v)])
    raise NotImplementedError(
        f"invalid watch callback paremeter annotation {ann} found. candidate annotations: "
        "oneflow.typing.Numpy, oneflow.typing.ListNumpy, oneflow.typing.ListListNumpy")


def watch(blob, handler_or_prompt=None):
    """Call the handler with `blob`'s value after every run of the job."""
    builder = current_builder("flow.watch")
    builder.watches.append((blob, _make_handler(blob, handler_or_prompt), False, user_location()))


def watch_diff(blob, handler_or_prompt=None):
    """Call the handler with d(sum of loss)/d(blob) after every run of the train job."""
    builder = current_builder("flow.watch_diff")
    builder.watches.append((blob, _make_handler(blob, handler_or_prompt), True, user_location()))

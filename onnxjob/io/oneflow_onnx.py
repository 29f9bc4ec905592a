"""`flow.onnx.export`: OneFlow <= 0.3's built-in ONNX exporter, on onnxjob's export.

OneFlow 0.3 (`oneflow/python/onnx`) exported a job with the weights of a saved model:

    flow.onnx.export(job_func, model_save_dir, onnx_filename, continue_on_error=False,
                     opset=None, extra_opset=None, shape_override=None,
                     external_data=False)

and before that returned the ModelProto instead of writing a file
(`export(job_func, model_save_dir, continue_on_error=False, target=None, opset=None, ...)`).
onnxjob's graphs are ONNX already: the job is exported as `flow.export` does
(io/export.py), with the variables read from `model_save_dir` (not the session's current
values), converted to `opset` when one is asked for (an older one by
io/opset_lowering.py), and with `external_data` the weights beside the file (onnx's
external data; also without it when they are past protobuf's 2 GiB limit:
io/model_file.py). (Where an op has no form in `opset`, the file keeps the job's opset,
with a warning.) Every op converts, so `continue_on_error` changes nothing;
`extra_opset`, `shape_override`, `target` and `inputs_as_nchw` (tf2onnx's options) are
refused when given. `model_save_dir=None` exports the variables' current values.
OneFlow's standalone converter, `oneflow_onnx`, is served by the same code
(compat/oneflow_onnx_converter.py).
"""
import warnings

from onnx import version_converter

from onnxjob.errors import UnsupportedAPIError
from onnxjob.frontend.config import started_session
from onnxjob.io import checkpoint
from onnxjob.io.export import job_model_proto, set_dynamic_batch
from onnxjob.io.model_file import check_in_memory, save_checked
from onnxjob.io.opset_lowering import default_opset, lower
from onnxjob.source_info import user_frame, user_location


def export(job_func, model_save_dir, onnx_filename=None, continue_on_error=False, opset=None,
           extra_opset=None, shape_override=None, external_data=False, target=None,
           inputs_as_nchw=None):
    """Write `job_func` with the variables saved in `model_save_dir` to `onnx_filename`
    (OneFlow 0.3); without a file name (OneFlow's earlier form, whose third positional
    argument is `continue_on_error`), return the ModelProto."""
    # continue_on_error asked OneFlow's converter to go on past an op it could not
    # convert; every node of an onnxjob job is ONNX already, so it changes nothing
    if isinstance(onnx_filename, bool):     # export(job, dir, continue_on_error, ...)
        onnx_filename = None
    refuse_graph_options("flow.onnx.export", extra_opset=extra_opset,
                         shape_override=shape_override, target=target,
                         inputs_as_nchw=inputs_as_nchw)
    return export_saved(job_func, model_save_dir, onnx_filename, opset, external_data)


def refuse_graph_options(api, **options):
    """UnsupportedAPIError for the first of OneFlow's converter options (tf2onnx's) given."""
    for name, value in options.items():
        if value:
            raise UnsupportedAPIError(
                f"{user_location()}: {api}({name}=...) is not provided by onnxjob: "
                "it rewrites the graph of OneFlow's converter; onnxjob's job graph is ONNX "
                "as traced")


def export_saved(job_func, model_save_dir, onnx_filename, opset=None, external_data=False,
                 dynamic_batch=False, api="flow.onnx.export"):
    """The export itself (module docstring); `model_save_dir` None takes the variables'
    current values; `dynamic_batch` writes a predict job's batch axis as a symbolic
    dimension (the standalone converter's dynamic_batch_size:
    compat/oneflow_onnx_converter.py); `api` names the caller in messages."""
    saved = None if model_save_dir is None else _saved_values(model_save_dir)
    proto = job_model_proto(job_func, values=saved)
    if dynamic_batch:
        set_dynamic_batch(job_func, proto, True)
    if opset is not None:
        proto = _converted(proto, int(opset), api)
    if onnx_filename is None:
        check_in_memory(proto)
        return proto
    save_checked(proto, onnx_filename, external_data=bool(external_data), api=api)
    return None


def _saved_values(model_save_dir):
    """{variable name: array} of the checkpoint in `model_save_dir`, each checked against
    its variable (as flow.load_variables checks); names no job has are left out."""
    session = started_session(sync=True)
    values = {}
    for name, entry in checkpoint.get(model_save_dir).items():
        spec = session.variable_specs.get(name)
        if spec is not None:
            values[name] = checkpoint.value_array(name, entry, spec)[0]
    return values


def _converted(proto, opset, api):
    """`proto` in ONNX opset `opset`: onnx's version converter for a newer opset, onnxjob's
    lowering (io/opset_lowering.py) for an older one. (onnx's converter is not used to go
    down: it relabels Softmax 13 as Softmax 11 over the same axis, which normalizes over
    every axis from it on: a silently different model.) Where an op has no form in that
    opset, `proto` as it is, with a warning at the user's line (the file then needs a
    runtime of the job's opset, which computes the same values)."""
    current = default_opset(proto)
    if opset == current:
        return proto
    try:
        if opset > current:
            return version_converter.convert_version(proto, opset)
        return lower(proto, opset)
    except Exception as e:  # LoweringError; onnx's converter raises RuntimeError etc.
        reason = str(e).strip().splitlines()[-1]
        warnings.warn_explicit(
            f"{api}(opset={opset}): the job's graph cannot be written in opset "
            f"{opset} ({reason}); the file keeps opset {current}",
            UserWarning, *(user_frame() or ("<unknown>", 0)))
        return proto

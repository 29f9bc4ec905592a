"""`oneflow_onnx`, OneFlow's standalone ONNX converter (Oneflow-Inc/oneflow_convert), in the
form that converted job functions (2021, OneFlow 0.4 and 0.5's single client), as the
`oneflow` alias hands it out (compat/oneflow_alias.py):

    from oneflow_onnx.oneflow2onnx.util import export_onnx_model, convert_to_onnx_and_check
    from oneflow_onnx.oneflow2onnx.flow2onnx import Export

    export_onnx_model(job_func, external_data=False, opset=None, flow_weight_dir=None,
                      onnx_model_path="/tmp", dynamic_batch_size=False)
        -> (path of <onnx_model_path>/model.onnx, cleanup function that removes it)
    convert_to_onnx_and_check(job_func, print_outlier=False, explicit_init=False,
                              external_data=False, ort_optimize=True, opset=None,
                              flow_weight_dir=None, onnx_model_path="/tmp",
                              dynamic_batch_size=False)
    Export(job_func, model_save_dir, onnx_filename, continue_on_error=False, opset=None,
           extra_opset=None, shape_override=None, external_data=False,
           dynamic_batch_size=False)
    run_onnx(onnx_model_path, providers, ipt_dict=None, ort_optimize=True)
    compare_result(a, b, rtol=1e-2, atol=1e-5, print_outlier=False)

The converter read OneFlow's compiled job and its saved weights and rebuilt the graph in
ONNX; onnxjob's job graph is ONNX already, so each call is `flow.onnx.export`'s
(io/oneflow_onnx.py): the job with the weights of `flow_weight_dir` (the session's current
values when it is None, as the converter then saved them first), converted to `opset`.
`dynamic_batch_size=True` writes the batch axis of a predict job's inputs and outputs as a
symbolic dimension. `convert_to_onnx_and_check` runs the file in onnxruntime on random
inputs in [-10, 10) and asserts that the job gives the same, then clears the default
session, as the converter's did; `explicit_init` (a trick that kept OneFlow's checkpoint
saving from hanging on a job without variables) changes nothing here. Later releases of
the converter, for OneFlow's eager `nn.Graph`, and its other packages (x2oneflow) are not
provided.
"""
import os

import numpy as np

from onnxjob.io.oneflow_onnx import export_saved, refuse_graph_options

_EXPORT = "oneflow_onnx.oneflow2onnx.flow2onnx.Export"


def Export(job_func, model_save_dir, onnx_filename, continue_on_error=False, opset=None,
           extra_opset=None, shape_override=None, external_data=False,
           dynamic_batch_size=False):
    """Write `job_func` with the weights saved in `model_save_dir` (the current ones when
    it is None) to `onnx_filename`."""
    # continue_on_error: every node of an onnxjob job is ONNX already
    refuse_graph_options(_EXPORT, extra_opset=extra_opset, shape_override=shape_override)
    export_saved(job_func, model_save_dir, onnx_filename, opset, external_data,
                 dynamic_batch=dynamic_batch_size, api=_EXPORT)


def export_onnx_model(job_func, external_data=False, opset=None, flow_weight_dir=None,
                      onnx_model_path="/tmp", dynamic_batch_size=False):
    """Write `job_func` to `<onnx_model_path>/model.onnx` (`onnx_model_path` is a folder)
    with the weights saved in `flow_weight_dir`, or the current ones when it is None;
    returns the file's path and a function that removes the file."""
    path = os.path.join(onnx_model_path, "model.onnx")
    # (no weight folder: the current values, which the converter saved and read back)
    Export(job_func, flow_weight_dir, path, opset=opset, external_data=external_data,
           dynamic_batch_size=dynamic_batch_size)

    def cleanup():
        if os.path.exists(path):
            os.remove(path)
    return path, cleanup


def run_onnx(onnx_model_path, providers, ipt_dict=None, ort_optimize=True):
    """Run a one-output model in onnxruntime on the providers of `providers` this
    onnxruntime has: on `ipt_dict` ({input name: array}), returning the output, or on
    random float32 inputs in [-10, 10), returning (inputs, output)."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
                                        if ort_optimize else
                                        ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    available = set(ort.get_available_providers())
    chosen = [p for p in providers if p in available] or ["CPUExecutionProvider"]
    session = ort.InferenceSession(onnx_model_path, sess_options=options, providers=chosen)
    if len(session.get_outputs()) != 1 or len(session.get_inputs()) > 1:
        raise ValueError(f"oneflow_onnx run_onnx: {onnx_model_path} has "
                         f"{len(session.get_inputs())} inputs and "
                         f"{len(session.get_outputs())} outputs; it runs models of at most "
                         "one input and one output")
    given = ipt_dict is not None
    if not given:
        ipt_dict = {i.name: np.random.uniform(-10, 10, size=i.shape).astype(np.float32)
                    for i in session.get_inputs()}
    result = session.run([], dict(ipt_dict))[0]
    return result if given else (ipt_dict, result)


def compare_result(a, b, rtol=1e-2, atol=1e-5, print_outlier=False):
    """Assert that `a` and `b` are close; `print_outlier` prints each element that is not."""
    a, b = np.asarray(a), np.asarray(b)
    if print_outlier:
        flat_a, flat_b = a.reshape(-1), b.reshape(-1)
        for i in np.flatnonzero(np.abs(flat_a - flat_b) > atol + rtol * np.abs(flat_b)):
            print(f"a[{i}]={flat_a[i]}, b[{i}]={flat_b[i]}")
    assert np.allclose(a, b, rtol=rtol, atol=atol)


def convert_to_onnx_and_check(job_func, print_outlier=False, explicit_init=False,
                              external_data=False, ort_optimize=True, opset=None,
                              flow_weight_dir=None, onnx_model_path="/tmp",
                              dynamic_batch_size=False):
    """Export `job_func` (as export_onnx_model), check the file against the job on random
    inputs (not with a dynamic batch), then clear the default session."""
    import onnxjob
    path, _ = export_onnx_model(job_func, external_data, opset, flow_weight_dir,
                                onnx_model_path, dynamic_batch_size)
    if not dynamic_batch_size:
        inputs, expected = run_onnx(path, ["CPUExecutionProvider"], ort_optimize=ort_optimize)
        result = job_func(*inputs.values())
        if not isinstance(result, np.ndarray):
            result = result.get()
            result = result if isinstance(result, np.ndarray) else result.numpy()
        compare_result(result, expected, print_outlier=print_outlier)
    onnxjob.clear_default_session()

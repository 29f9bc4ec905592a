"""Export a compiled job as a self-contained `.onnx` file.

Variables become initializers holding their current values, so the file runs in plain
onnxruntime with only the job's placeholders as inputs. Each node keeps the user's
`file:line` in its `source` metadata property.
"""
import numpy as np
import onnx

from onnxjob.graph.compiler import check_model
from onnxjob.frontend.config import started_session


def job_model_proto(job_fn, with_variables=True):
    """The ModelProto of `job_fn` (a decorated job); starts the session if needed."""
    session = started_session(sync=True)
    name = job_fn.job.name if hasattr(job_fn, "job") else str(job_fn)
    runtime = session.runtimes[name]
    proto = onnx.ModelProto()
    proto.CopyFrom(runtime.compiled.to_proto())
    if with_variables:
        graph = proto.graph
        keep = []
        variable_of_input = {i: v for v, i in runtime.compiled.variable_inputs.items()}
        for value_info in graph.input:
            if value_info.name in variable_of_input:
                array = np.asarray(session.variable_numpy(variable_of_input[value_info.name]))
                graph.initializer.append(onnx.numpy_helper.from_array(array, value_info.name))
            else:
                keep.append(value_info)
        del graph.input[:]
        graph.input.extend(keep)
    return proto


def export(job_fn, path, check=True):
    """Write `job_fn`'s graph with current variable values to `path` (checked by onnx)."""
    proto = job_model_proto(job_fn)
    if check:
        check_model(proto)
    onnx.save(proto, path)
    return path

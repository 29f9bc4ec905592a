"""Blob values read inside an eager job body (OneFlow 0.2-0.4's eager mode).

Under `flow.enable_eager_execution(True)` OneFlow ran a job's body op by op at each call,
so the body could read a blob's value (`blob.numpy()`, `blob.numpy_list()`) to print it
or to branch on it in Python. onnxjob runs jobs as graphs; a body that reads a value is
traced again at each call, with the call's arguments at hand (Session.runtime_with_values):
`ValueReader` computes the value from the graph traced so far, cut at the blob (the
forward up to it, through the pass pipeline, on the CPU EP), fed with the call's
arguments and the variables' values before the call. The job's graph for the call is the
rest of the trace; a call whose trace equals the last one's runs the same onnxruntime
session, and the cut graphs' sessions are kept per graph too, so a loop whose body takes
the same path at each call compiles once.

A value read this way is what the job computes for that blob, except where the graph
draws random numbers before it (dropout, random initial data): the cut graph draws its
own.
"""
import contextlib
import hashlib
import io
import sys

import numpy as np
import onnx_ir as ir
from onnx_ir.passes import common

from onnxjob.errors import UnsupportedAPIError
from onnxjob.graph import tracer
from onnxjob.graph.compiler import IR_VERSION
from onnxjob.passes import run_default_pipeline
from onnxjob.runtime import backend
from onnxjob.runtime.pipeline import HostPipeline
from onnxjob.source_info import user_location

class ValueReader:
    """`reader(blob)`: the value of `blob` in `job`'s body for one call with `feeds`
    (placeholder name -> array), in `session` (its variables as they are)."""

    def __init__(self, session, job, feeds):
        self.session = session
        self.job = job
        self.feeds = feeds

    def __call__(self, blob):
        name = blob.value.name
        builder = blob.builder
        if name in self.feeds:
            return np.array(self.feeds[name])
        if name in builder.sources:
            return self._host_values(builder, [name], blob)[name]
        variables = _variables_by_input(builder)
        if name in variables:       # a variable: its value before this call's step
            return self._variable_values([variables[name]])[0]
        if name in builder.graph.initializers:      # a constant
            return np.array(builder.graph.initializers[name].const_value.numpy())
        proto = ir.to_proto(ir.Model(builder.graph, ir_version=IR_VERSION,
                                     producer_name="onnxjob"))
        key = hashlib.sha256(proto.SerializeToString() + name.encode()).digest()
        ort_session, input_names = self.session.eager_cut_sessions.get_or_make(
            key, lambda: self._cut_session(proto, name))
        inputs = self._inputs(builder, input_names, blob)
        return ort_session.run([name], inputs)[0]

    def _cut_session(self, proto, name):
        """(onnxruntime session, its input names) of the graph cut at value `name`."""
        model = ir.from_proto(proto)
        graph = model.graph
        value = next(v for node in graph for v in node.outputs if v.name == name)
        graph.outputs.clear()
        graph.outputs.append(value)
        common.RemoveUnusedNodesPass()(model)
        for unused in [v for v in graph.inputs if not v.uses()]:
            graph.inputs.remove(unused)
        run_default_pipeline(model, self.job.config, "cpu")
        session = backend.create_session(ir.to_proto(model).SerializeToString(), "cpu",
                                         is_train=False)
        return session, [i.name for i in session.get_inputs()]

    def _inputs(self, builder, input_names, blob):
        """The cut graph's feeds: the call's arguments and the variables' values."""
        variables = _variables_by_input(builder)
        inputs = self._host_values(
            builder, [i for i in input_names if i in builder.sources], blob)
        read = [i for i in input_names if i not in self.feeds and i in variables]
        inputs.update(zip(read, self._variable_values([variables[i] for i in read])))
        inputs.update({i: self.feeds[i] for i in input_names if i in self.feeds})
        return inputs

    def _variable_values(self, names):
        """The values of variables `names` before this call (drawn now for the variables
        this trace declared first)."""
        if any(name not in self.session.variable_values for name in names):
            self.session.draw_new_variables()
        return [self.session.variable_numpy(name) for name in names]

    def _host_values(self, builder, input_names, blob):
        """The values host ops make for graph inputs `input_names` from this call's
        arguments (tensor lists, image decoders fed by the job's arguments)."""
        pipeline = HostPipeline({n: builder.sources[n] for n in input_names})
        if not pipeline.made_from_feeds_only():
            raise UnsupportedAPIError(
                f"{user_location()}: blob.numpy() of {blob.name} in eager job "
                f"{self.job.name!r}: it is computed from what a data reader makes as the job "
                "runs, and reading it here would take the reader's next samples; onnxjob "
                "reads values made from the job's arguments and variables (return the blob "
                "from the job, or flow.watch it)")
        return pipeline.make_feeds(self.feeds)


def _variables_by_input(builder):
    """{graph input name: variable name} of the variables `builder`'s trace reads."""
    return {b.value.name: n for n, b in builder.variables.items()}


def first_trace(compile_one, with_values):
    """`compile_one()` (a job's trace when the session starts), with what the body prints
    held back under eager mode, unless traced `with_values` (a call's), and printed unless
    the body read a blob's value: such a body runs again at each call, with values, and
    prints there; its first trace only declares its variables, reading zeros."""
    if tracer.eager_requested_at is None or with_values:
        return compile_one()
    printed = io.StringIO()
    graph = None
    try:
        with contextlib.redirect_stdout(printed):
            graph = compile_one()
    finally:
        if graph is None or graph.values_read is None:
            sys.stdout.write(printed.getvalue())
    return graph

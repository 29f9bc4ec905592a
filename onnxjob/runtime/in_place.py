"""A CPU train step that writes variables into their own arrays (graph/in_place.py says
which may be), so that the step holds one copy of its variables and optimizer state.

onnxruntime reads a NumPy array bound as an input and writes an output bound to an
OrtValue over a NumPy array without copying either (IOBinding), so the in-place
variables' arrays are bound once, as inputs and as the outputs of their next values, and
bound again only when the store holds another array for one (a checkpoint load, an
assignment). The other variables (a train step counter that the learning-rate schedule
reads) are replaced as before. A step's values land together: a SIGINT that arrives while
the step writes is delivered after the store is up to date.
"""
import numpy as np
import onnxruntime as ort

from onnxjob.runtime.executor import interrupt_deferred


class HostInPlaceStep:
    """Runs a CPU train session's steps; `in_place` names the variables written in place.

    `variable_inputs` and `state_items` are (variable, graph input) and (variable, graph
    output) pairs, `user_outputs` the graph outputs returned, `store` the session's
    VariableStore (NumPy arrays)."""

    def __init__(self, session, variable_inputs, state_items, user_outputs, in_place, store):
        self._session = session
        self._store = store
        self._binding = session.io_binding()
        self._variable_inputs = list(variable_inputs)
        self._state_names = [v for v, _ in state_items]
        self._in_place = {v: out for v, out in state_items if v in in_place}
        self._replaced = [(v, out) for v, out in state_items if v not in in_place]
        self._user_outputs = list(user_outputs)
        self._bound = {}        # variable -> the array bound for it

    def _bind_variables(self):
        store, binding, bound = self._store, self._binding, self._bound
        for variable, input_name in self._variable_inputs:
            value = store[variable]
            if bound.get(variable) is value:
                continue
            out = self._in_place.get(variable)
            if out is not None:
                if not (value.flags.writeable and value.flags.c_contiguous and
                        value.flags.aligned):   # (e.g. an array over a file's bytes)
                    value = store[variable] = np.array(value, order="C")
                binding.bind_ortvalue_output(out, ort.OrtValue.ortvalue_from_numpy(value))
            binding.bind_cpu_input(input_name, value)
            bound[variable] = value

    def run(self, feeds):
        """One step: returns the user outputs; in-place variables hold their next values,
        the others are replaced in the store."""
        binding, store = self._binding, self._store
        for name, value in feeds.items():
            binding.bind_cpu_input(name, value)
        # NOTE: bound again each step: a binding keeps the OrtValue its last run allocated
        # for an output and writes the next run's into it, over the arrays stored from it
        for name in self._user_outputs:
            binding.bind_output(name, "cpu")
        for _, out in self._replaced:
            binding.bind_output(out, "cpu")
        self._bind_variables()
        n = len(self._user_outputs)
        with interrupt_deferred():
            self._session.run_with_iobinding(binding)
            # (in the order bound: the user's, the replaced, the in-place outputs)
            outs = binding.get_outputs()
            new = {v: o.numpy() for (v, _), o in zip(self._replaced, outs[n:])}
            store.replace_all(self._state_names,
                              [new[v] if v in new else store[v] for v in self._state_names])
        return [o.numpy() for o in outs[:n]]

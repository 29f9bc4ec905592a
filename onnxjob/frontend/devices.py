"""`flow.placement` and `flow.device`, in each OneFlow generation's sense.

OneFlow 0.2-0.3: `flow.placement.current_scope()` is the placement scope in effect
(deprecated there for flow.current_scope(), still called by model code such as
two_stage_reduce: its `default_device_tag`, `machine_id2device_id_list`, `parallel_size`),
and `flow.device("gpu:0")` opens a placement scope on one device.
OneFlow 0.4-0.5: `flow.placement(device_tag, {machine: [devices]})` and
`flow.device("cuda:0")` are values naming devices (eager tensors are placed with them).
Both are provided: a value that is also a context manager, placing the ops built inside as
flow.scope.placement does (advisory: onnxjob runs a whole job on one execution provider).
"""
import re

from onnxjob.frontend import scope
from onnxjob.graph.tracer import current_builder, in_job
from onnxjob.runtime.session import default_session


def _as_ids_strings(table):
    return [f"{m}:{d}" for m, devices in table.items() for d in devices]


class PlacementScope:
    """A placement: device tag and {machine id: [device ids]}, as OneFlow's
    PlacementScope / placement symbol describe one."""

    def __init__(self, device_tag, machine_device_ids, hierarchy=None):
        if device_tag not in ("cpu", "gpu", "cuda"):
            raise ValueError(f"device tag must be 'cpu', 'gpu' or 'cuda', got {device_tag!r}")
        self.device_tag = device_tag
        self.machine_id2device_id_list = scope.machine_device_lists(machine_device_ids)
        self.hierarchy = list(hierarchy) if hierarchy is not None else [self.parallel_num]
        self._scope = None

    default_device_tag = property(lambda self: self.device_tag)
    parallel_num = property(lambda self: sum(map(len, self.machine_id2device_id_list.values())))
    parallel_size = parallel_num

    def __enter__(self):
        tag = "gpu" if self.device_tag == "cuda" else self.device_tag
        self._scope = scope.placement(tag, _as_ids_strings(self.machine_id2device_id_list))
        self._scope.__enter__()
        return self

    def __exit__(self, *exc):
        self._scope.__exit__(*exc)
        return False

    def __eq__(self, other):
        return isinstance(other, PlacementScope) and \
            (self.device_tag, self.machine_id2device_id_list) == \
            (other.device_tag, other.machine_id2device_id_list)

    def __hash__(self):
        return hash((self.device_tag, str(self.machine_id2device_id_list)))

    def __repr__(self):
        return (f"oneflow.placement(device_tag={self.device_tag!r}, "
                f"machine_device_ids={self.machine_id2device_id_list}, "
                f"hierarchy={self.hierarchy})")


class placement(PlacementScope):     # noqa: N801  (OneFlow's name)
    """`flow.placement(device_tag, machine_device_ids, hierarchy=None)`, and OneFlow
    0.2's `flow.placement.current_scope()` (see the module docstring)."""

    @staticmethod
    def current_scope():
        """The placement in effect: the innermost flow.scope.placement (or flow.device /
        flow.placement scope), else, in a job, its function_config's
        default_placement_scope, else the session's device 0 (as Blob.parallel_conf)."""
        if in_job():
            conf = current_builder().placement_in_effect()
            return PlacementScope(conf.device_tag, list(conf.device_name))
        inner = scope.current_placement()
        if inner is not None:
            return PlacementScope(inner.device_tag, inner.machine_device_ids or "0:0")
        from onnxjob.frontend.helpers import default_machine_device_ids
        return PlacementScope("gpu" if default_session().device == "cuda" else "cpu",
                              default_machine_device_ids())


class device(PlacementScope):        # noqa: N801  (OneFlow's name)
    """`flow.device("cuda:0")` / `flow.device("gpu", 0)`: one device, with OneFlow 0.5's
    `type` and `index`; as a context manager (OneFlow 0.2) the ops built inside are placed
    on it."""

    def __init__(self, kind, index=None):
        if isinstance(kind, device):
            kind, index = kind.type, kind.index if index is None else index
        match = re.fullmatch(r"(cpu|gpu|cuda)(?::(\d+))?", str(kind))
        if match is None:
            raise ValueError(f"flow.device takes 'cpu', 'cuda' or 'gpu' with an optional "
                             f"':index', got {kind!r}")
        if match.group(2) is not None and index is not None:
            raise ValueError(f"flow.device({kind!r}, {index!r}): the index is given twice")
        self.type = match.group(1)
        self.index = int(match.group(2) or index or 0)
        super().__init__(self.type, {0: [self.index]})

    def __eq__(self, other):
        return isinstance(other, device) and (self.type, self.index) == (other.type,
                                                                          other.index)

    def __hash__(self):
        return hash((self.type, self.index))

    def __repr__(self):
        return f"device(type='{self.type}', index={self.index})"

    def __str__(self):
        return f"{self.type}:{self.index}"

"""`flow.distribute`: distribution schemes of variables and blobs, and the deprecated
strategy names (OneFlow's framework/distribute.py).

onnxjob runs a job on one device, so a scheme changes no number: `split(axis)`,
`broadcast()` and `auto()` are values that `flow.get_variable(distribute=...)`,
`layers.dense(model_distribute=...)` and `parallel_cast` accept.
`mirrored_strategy()` / `consistent_strategy()` are the deprecated spellings of
`flow.scope.mirrored_view()` / `consistent_view()` and return those objects.

The distribution surface of OneFlow's lazy blobs is installed on Blob here, as OneFlow's
framework registers it on its blob classes: `with_distribute` & co. (a hint the compiler
reads, which changes no value), `distribute`, `split_axis`, `parallel_size`,
`with_gradient_distribute`, and the ones OneFlow 0.2-0.4 had (`batch_axis`,
`has_batch_axis()`, `disable_boxing`, `with_boxing_disabled`, `lbi`, `blob_name`,
`job_name`, `IdenticalTo`).
"""
import types

from onnxjob.compat.generations import print_deprecated
from onnxjob.errors import missing_api
from onnxjob.frontend import scope
from onnxjob.graph.split_batch import Split, kind_while_tracing
from onnxjob.graph.tracer import Blob, op
from onnxjob.ops._array_common import BATCH_AXIS


# OneFlow's split axis of a blob that is not split (py_blob_desc.h)
INVALID_SPLIT_AXIS = -22
# OneFlow <= 0.3's batch axis of a blob that has none: 0.2's Blob.batch_axis is None there
# (`is None`), 0.3 compares it with flow.INVALID_BATCH_AXIS; Blob.batch_axis gives None, so
# both hold
INVALID_BATCH_AXIS = None


class Distribute:
    """A distribution scheme (OneFlow's `oneflow._oneflow_internal.distribute.Distribute`)."""

    def __eq__(self, other):
        return type(self) is type(other) and vars(self) == vars(other)

    def __hash__(self):
        return hash((type(self).__name__, tuple(sorted(vars(self).items()))))


class SplitDistribute(Distribute):
    """Split along `axis`."""

    def __init__(self, axis):
        self.axis = axis

    def __repr__(self):
        return f"flow.distribute.split({self.axis})"


class BroadcastDistribute(Distribute):
    """Every device holds the whole value."""

    def __repr__(self):
        return "flow.distribute.broadcast()"


class AutoDistribute(Distribute):
    """The compiler chooses."""

    def __repr__(self):
        return "flow.distribute.auto()"


def split(axis):
    """The scheme that splits a blob or variable at `axis` (an int, as OneFlow asserts)."""
    assert type(axis) is int
    return SplitDistribute(axis)


def broadcast():
    """The broadcast scheme."""
    return BroadcastDistribute()


def auto():
    """The automatic scheme."""
    return AutoDistribute()


def assert_is_valid_distribute(distribute):
    """OneFlow's check that `distribute` is one of the three schemes."""
    assert isinstance(distribute, Distribute), (
        "not a valid distribute policy.\n           expected: 1) "
        "oneflow.compatible.single_client.distribute.split(axis); 2) "
        "oneflow.compatible.single_client.distribute.broadcast(); 3) "
        "oneflow.compatible.single_client.distribute.auto()")


def _deprecated(name, replacement):
    print_deprecated(f"distribute.{name}", f"scope.{replacement}")


def mirrored_strategy():
    """Deprecated `flow.scope.mirrored_view()` (prints OneFlow's warning)."""
    _deprecated("mirrored_strategy", "mirrored_view")
    return scope.mirrored_view()


def consistent_strategy():
    """Deprecated `flow.scope.consistent_view()` (prints OneFlow's warning)."""
    _deprecated("consistent_strategy", "consistent_view")
    return scope.consistent_view()


def mirrored_strategy_enabled():
    """Deprecated: whether a `with flow.scope.mirrored_view():` block is open here."""
    _deprecated("mirrored_strategy_enabled", "mirrored_view_enabled")
    return scope.mirrored_view_enabled()


def consistent_strategy_enabled():
    """Deprecated: the opposite of `mirrored_strategy_enabled()`."""
    _deprecated("consistent_strategy_enabled", "consistent_view_enabled")
    return not scope.mirrored_view_enabled()


# -- the lazy blob's distribution surface -------------------------------------------------

def _hinted(blob, distribute, gradient_distribute=None):
    """`blob` through an Identity that carries the hint (a new Blob, as OneFlow's
    with_distribute returns a new blob object of the same logical blob)."""
    assert_is_valid_distribute(distribute)
    out = op("Identity", blob)
    out.distribute_hint = distribute
    return out


def _with_distribute(self, distribute):
    """This blob with the distribution hint `distribute` (flow.distribute.split(axis),
    broadcast() or auto()): how a consumer on several devices should read it. The values
    are the same; on one device, and on onnxjob's data-parallel ranks (whose split is
    found from the graph, graph/split_batch.py), the hint changes nothing."""
    return _hinted(self, distribute)


def _with_split_distribute(self, axis):
    """`with_distribute(flow.distribute.split(axis))`."""
    return _hinted(self, split(axis))


def _with_broadcast_distribute(self):
    """`with_distribute(flow.distribute.broadcast())`."""
    return _hinted(self, broadcast())


def _with_gradient_distribute(self, distribute):
    """`flow.parallel_cast(self, gradient_distribute=distribute)`: a hint for the
    gradient's distribution; the values, and the gradient, are unchanged."""
    assert_is_valid_distribute(distribute)
    return op("Identity", self)


def _distribute(self):
    """The distribution hint given with with_distribute (auto() when none was)."""
    return self.distribute_hint or auto()


def _parallel_size(self):
    """How many devices the blob lies on (OneFlow: its placement's parallel_num): the
    world size of a data-parallel train step; else the device count of the
    flow.scope.placement it was made under or the job's default placement
    (flow.config.gpu_device_num(4) on one device: 4, as a program written for 4 GPUs
    reads it; the values are those of one device)."""
    ranks = self.builder.data_parallel_ranks
    if ranks and ranks > 1:
        return ranks
    if self.placement:
        return scope.device_count(self.placement.device_name())
    from onnxjob.frontend.helpers import default_parallel_num
    return default_parallel_num()


def _split_axis(self):
    """The axis the blob is split on across its devices, OneFlow's producer view;
    INVALID_SPLIT_AXIS (-22) when it is not split. On one device OneFlow 0.5 makes every
    blob broadcast (OneFlow <= 0.4 said split(0) there), so -22; on data-parallel ranks,
    the axis that carries this rank's rows (a placeholder's batch axis, what is computed
    row by row from it), -22 for whole values and partial sums."""
    ranks = self.builder.data_parallel_ranks
    if not ranks or ranks < 2:
        return INVALID_SPLIT_AXIS
    axis = _rows_axis(self, ranks)
    return INVALID_SPLIT_AXIS if axis is None else axis


def _rows_axis(blob, ranks):
    """The axis of `blob` that carries the placeholders' rows when the job traced so far
    is split over `ranks` (graph/split_batch.py's rules), or None (a value the rows do not
    index: a variable's, a sum over the batch)."""
    builder = blob.builder
    variables = {v.value.name for v in builder.variables.values()}
    placeholders = [v.name for v in builder.graph.inputs if v.name not in variables]
    kind = kind_while_tracing(builder.graph, blob.value, placeholders, ranks,
                              builder.job_name)
    return kind.axis if isinstance(kind, Split) else None


def _batch_axis(self):
    """OneFlow <= 0.3's batch axis: the axis that indexes the placeholders' rows (0 for a
    placeholder; moved by a transpose, gone after a reduction over it), None where there
    is none (variables, sums over the batch), or what its op set (`keep_batch_axis`)."""
    kept = self.value.metadata_props.get(BATCH_AXIS)
    if kept is not None:
        return None if kept == "none" else int(kept)
    return _rows_axis(self, 2)


def _identical_to(self, other):
    """OneFlow's IdenticalTo: the same logical blob, shape, split and dynamism."""
    return (isinstance(other, Blob) and self.value is other.value and
            self.shape == other.shape and self.is_dynamic == other.is_dynamic)


def _install_blob_surface():
    Blob.with_distribute = _with_distribute
    Blob.with_split_distribute = _with_split_distribute
    Blob.with_broadcast_distribute = _with_broadcast_distribute
    Blob.with_gradient_distribute = _with_gradient_distribute
    Blob.distribute = property(_distribute)
    Blob.parallel_size = property(_parallel_size)
    Blob.split_axis = property(_split_axis)
    Blob.batch_axis = property(_batch_axis)
    Blob.has_batch_axis = lambda self: _batch_axis(self) is not None
    Blob.disable_boxing = property(lambda self: None)
    Blob.with_boxing_disabled = lambda self, val=True: op("Identity", self)
    # (OneFlow 0.5's cfg LogicalBlobId reads `lbi.op_name()`, <= 0.4's protobuf
    # `lbi.op_name`: either works)
    Blob.lbi = property(lambda self: types.SimpleNamespace(
        op_name=scope.callable_str(self.op_name), blob_name=scope.callable_str(self.blob_name)))
    # a mirrored blob's per-device blobs: this one device's
    Blob.sub_consistent_blob_list = property(lambda self: [self])
    Blob.job_name = property(lambda self: self.builder.job_name)
    Blob.IdenticalTo = _identical_to
    # OneFlow's warning text when a mirrored blob's shape is read in a consistent view (and
    # the reverse); one device's views agree, so there is nothing to warn of
    Blob.get_lazy_shape_log_warning = lambda self: ""
    Blob.get_mirror_shape_log_warning = lambda self: ""


_install_blob_surface()

__getattr__ = missing_api("flow.distribute")

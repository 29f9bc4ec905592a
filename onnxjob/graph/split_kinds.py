"""The kinds of a value in a graph split over data-parallel ranks (graph/split_batch.py,
whose module docstring says what each means; graph/split_rules.py gives them per op)."""

WHOLE, SUM, MEAN = "whole", "partial sum", "partial mean"


class Split(tuple):
    """The kind of a value split on `axis` (graph/split_batch.py's docstring says what
    `inner` is)."""
    __slots__ = ()

    def __new__(cls, axis, inner=1):
        return super().__new__(cls, (axis, inner))

    axis = property(lambda self: self[0])
    inner = property(lambda self: self[1])

    def __repr__(self):
        return f"split(axis={self.axis}, inner={self.inner})"

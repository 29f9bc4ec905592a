"""OneFlow's `ops/transpose_util` helpers, which model and test code import
(`oneflow.compatible.single_client.ops.transpose_util`): permutations that move an axis
to the last position and back."""


def is_perm(perm):
    """True when `perm` holds each of 0..len(perm)-1 once."""
    return sorted(perm) == list(range(len(perm)))


def get_perm_when_transpose_axis_to_last_dim(num_axes, axis):
    """The permutation that moves `axis` (negative counts from the end) to the last place,
    keeping the other axes in order."""
    axis = axis + num_axes if axis < 0 else axis
    if not 0 <= axis < num_axes:
        raise ValueError(f"axis {axis} is out of range for {num_axes} axes")
    return tuple(d if d < axis else d + 1 for d in range(num_axes - 1)) + (axis,)


def get_inversed_perm(perm):
    """The permutation that undoes `perm`."""
    if not is_perm(perm):
        raise ValueError(f"{tuple(perm)} is not a permutation")
    inverse = [0] * len(perm)
    for position, axis in enumerate(perm):
        inverse[axis] = position
    return tuple(inverse)

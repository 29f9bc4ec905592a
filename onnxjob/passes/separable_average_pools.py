"""SeparableAveragePools: an average pool over a large window as one pool per spatial axis.

Rewrite case (no auto_pad, no dilation, no ceil_mode, a window of at least MIN_WINDOW
elements whose output is more than one position):
    AveragePool(x, kernel (kh, kw), strides (sh, sw), pads, count_include_pad=c)
        ->  AveragePool(AveragePool(x, kernel (1, kw), strides (1, sw), W's pads, c),
                        kernel (kh, 1), strides (sh, 1), H's pads, c)
(and the same for 1 or 3 spatial axes). The windows are boxes, so the sum over a window is
the sum over its rows of the sums along the rows, and the elements a window counts (with or
without its padding) are the product of its counts along each axis: each pool divides by
its own axis' count, the two divisions by the window's. A window of kh x kw costs kh + kw
additions per output instead of kh * kw: the whole-image "SAME" pool of MobileNetV3's
squeeze-excite (ksize = the image, strides None: stride 1, an output per pixel) took 1.27 s
at 4 x 16 x 112 x 112 on the CPU's plain kernel, and its gradient is such a pool too
(graph/primitives/pooling.py `_window_sums`). Small windows (a 3x3 pool) and global pools
(one output: a reduction already) are left as they are: there the second pool's pass over
memory costs more than the additions it saves.
"""
import numpy as np
from onnx_ir.passes import InPlacePass, PassResult

from onnxjob.graph.primitives.windows import window_out

from ._util import NodeEmitter, attr, replace_value

MIN_WINDOW = 32


def _separable(node):
    """(kernel, strides, pads) of an AveragePool node worth separating, else None."""
    k = [int(v) for v in attr(node, "kernel_shape", [])]
    nd = len(k)
    shape = node.inputs[0].shape
    if nd < 2 or shape is None or len(shape) != nd + 2 or \
            not all(isinstance(d, int) for d in list(shape)[2:]):
        return None
    if attr(node, "auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET") or \
            attr(node, "ceil_mode", 0) or any(d != 1 for d in attr(node, "dilations", [1] * nd)):
        return None
    strides = [int(v) for v in attr(node, "strides", [1] * nd)]
    pads = [int(v) for v in attr(node, "pads", [0] * 2 * nd)]
    spatial = list(shape)[2:]
    out = [window_out(spatial[i], k[i], strides[i], 1, pads[i], pads[nd + i]) for i in range(nd)]
    if int(np.prod(k)) < MIN_WINDOW or all(o == 1 for o in out):
        return None
    return k, strides, pads


class SeparableAveragePools(InPlacePass):
    def call(self, model):
        graph = model.graph
        modified = False
        for node in list(graph):
            if node.op_type != "AveragePool" or node.domain != "" or node.graph is None:
                continue
            geometry = _separable(node)
            if geometry is None:
                continue
            k, strides, pads = geometry
            nd = len(k)
            e = NodeEmitter(graph, node, "separable")
            dtype = node.outputs[0].type.dtype
            value, shape = node.inputs[0], list(node.inputs[0].shape)
            # the last axis first: its pool reads the rows in memory order
            for axis in reversed(range(nd)):
                if k[axis] == 1 and strides[axis] == 1 and not pads[axis] and \
                        not pads[nd + axis]:
                    continue
                one = [1] * nd
                kernel, stride = list(one), list(one)
                kernel[axis], stride[axis] = k[axis], strides[axis]
                axis_pads = [0] * 2 * nd
                axis_pads[axis], axis_pads[nd + axis] = pads[axis], pads[nd + axis]
                shape[2 + axis] = window_out(shape[2 + axis], k[axis], strides[axis], 1,
                                             pads[axis], pads[nd + axis])
                value = e.node("AveragePool", [value], list(shape), dtype, kernel_shape=kernel,
                               strides=stride, pads=axis_pads,
                               count_include_pad=attr(node, "count_include_pad", 0))
            if replace_value(node.outputs[0], value):
                graph.remove(node, safe=True)
                modified = True
        return PassResult(model, modified)

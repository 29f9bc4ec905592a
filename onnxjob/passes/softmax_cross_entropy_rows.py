"""SoftmaxCrossEntropyRows: a per-row softmax cross entropy as a LogSoftmax over the last
axis and a gather of each row's label.

Rewrite case (logits (N, C), labels (N,), no weights, no ignore_index):
  loss, log_prob = SoftmaxCrossEntropyLoss(logits, labels, reduction="none")
    -> log_prob = LogSoftmax(logits, axis=-1)
       loss = Neg(Squeeze(GatherElements(log_prob, Unsqueeze(labels, 1), axis=1), 1))
onnxruntime has no SoftmaxCrossEntropyLoss kernel outside its training build: it expands
the ONNX function, whose LogSoftmax runs over axis 1 of the logits reshaped to (N, C, 1),
not their last axis, so the kernel transposes around it (and an Identity copies the
log-probabilities out). At BERT's masked-LM head, (160, 30522) float32 on 2 CPU threads,
the expansion took 8.4 ms and this form 2.7 ms, with equal results; onnxruntime's CUDA
softmaxes also take their fast path on the last axis only.
"""
import numpy as np
from onnx_ir.passes import InPlacePass, PassResult

from ._util import NodeEmitter, attr, replace_value, static_shape


def _match(node):
    """Whether `node` is a SoftmaxCrossEntropyLoss of the rewrite case."""
    if node.op_type != "SoftmaxCrossEntropyLoss" or node.domain != "" or \
            len(node.inputs) != 2 or attr(node, "reduction", "mean") != "none" or \
            node.attributes.get("ignore_index") is not None:
        return False
    logits, labels = node.inputs
    shape = static_shape(logits)
    return shape is not None and len(shape) == 2 and static_shape(labels) == shape[:1] and \
        logits.type is not None


class SoftmaxCrossEntropyRows(InPlacePass):
    def call(self, model):
        graph = model.graph
        modified = False
        for node in list(graph):
            if node.graph is None or not _match(node):
                continue
            logits, labels = node.inputs
            (n, _), dtype = static_shape(logits), logits.type.dtype
            e = NodeEmitter(graph, node, "rows")
            axis = e.const(np.array([1], np.int64))
            log_prob = e.node("LogSoftmax", [logits], static_shape(logits), dtype, axis=-1)
            column = e.node("Unsqueeze", [labels, axis], (n, 1), labels.type.dtype)
            picked = e.node("GatherElements", [log_prob, column], (n, 1), dtype, axis=1)
            loss = e.node("Neg", [e.node("Squeeze", [picked, axis], (n,), dtype)], (n,), dtype)
            outputs = [loss, log_prob]
            if all(replace_value(old, new) for old, new in zip(node.outputs, outputs)):
                graph.remove(node, safe=True)
                modified = True
        return PassResult(model, modified)

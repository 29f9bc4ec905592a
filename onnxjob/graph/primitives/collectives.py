"""Collectives across the ranks of a data-parallel run (runtime/distributed.py).

They are nodes of the domain "onnxjob.distributed", which onnxruntime does not run: a
data-parallel step cuts its graph at them into stages and performs them between the
stages' sessions (runtime/staged.py). Only data-parallel train jobs emit them (synchronized
batch norm, primitives/batch_norm.py); they carry no gradients themselves, since the
composite that emits them has its own gradient rule.

* `onnxjob.distributed.AllGather(x, ranks=W)`: shape (W,) + x.shape, rank r's x at [r];
* `onnxjob.distributed.AllReduceMean(x)`: the element-wise mean of x over the ranks;
* `onnxjob.distributed.AllReduceSum(x)`: the element-wise sum of x over the ranks;
* `onnxjob.distributed.RankLocal(x)`: x as this rank computed it (e.g. from its own rows),
  marked so that graph/split_batch.py takes it as it is; that split removes the node.
"""
from onnxjob.graph.registry import register

DOMAIN = "onnxjob.distributed"


def _gather_infer(inputs, attrs, num_outputs):
    x = inputs[0]
    return [((int(attrs["ranks"]),) + tuple(x.shape), x.np_dtype)]


def _same_infer(inputs, attrs, num_outputs):
    return [(tuple(inputs[0].shape), inputs[0].np_dtype)]


register(f"{DOMAIN}.AllGather", _gather_infer, None, differentiable=False, domain=DOMAIN)
register(f"{DOMAIN}.AllReduceMean", _same_infer, None, differentiable=False, domain=DOMAIN)
register(f"{DOMAIN}.AllReduceSum", _same_infer, None, differentiable=False, domain=DOMAIN)
register(f"{DOMAIN}.RankLocal", _same_infer, None, differentiable=False, domain=DOMAIN)

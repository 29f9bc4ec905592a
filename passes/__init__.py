"""Graph passes run over every job's onnx_ir model before it is emitted.

The default pipeline runs to a fixed point through `onnx_ir.passes.PassManager`. Users add
passes with `function_config.passes([MyPass()])` or `register_pass(MyPass)` (every job),
and turn the pipeline off with `function_config.disable_passes(True)` or
`ONNXJOB_DISABLE_PASSES=1` for debugging.
"""
import collections
import os

import onnx_ir as ir
import onnx_ir.passes as ir_passes
from onnx_ir.passes import common

_REGISTERED = []


def register_pass(pass_factory):
    """Run `pass_factory()` (an onnx_ir PassBase) on every job after the default passes."""
    _REGISTERED.append(pass_factory)
    return pass_factory


def default_passes():
    return [
        common.RemoveUnusedNodesPass(),
        common.TopologicalSortPass(),
    ]


def build_pipeline(config=None):
    extra = list(config.get("passes", []) if config is not None else [])
    extra += [factory() for factory in _REGISTERED]
    return ir_passes.PassManager(default_passes() + extra, steps=4, early_stop=True)


def passes_disabled(config=None):
    if os.environ.get("ONNXJOB_DISABLE_PASSES", "") not in ("", "0"):
        return True
    return bool(config is not None and config.get("disable_passes", False))


def run_default_pipeline(model, config=None):
    """Run the pipeline in place on `model`; returns the PassResult (or None if disabled)."""
    if passes_disabled(config):
        return None
    return build_pipeline(config)(model)


def op_counts(model):
    """{op_type: count} of a model's main graph, for looking at what passes did."""
    return dict(collections.Counter(node.op_type for node in model.graph))

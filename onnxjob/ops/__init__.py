"""The user-facing ops: flow.math, flow.nn, flow.layers and the top-level array ops."""

"""`flow.random`: random ops evaluated inside the graph, fresh on every run."""
from onnxjob.errors import missing_api

__getattr__ = missing_api("flow.random")

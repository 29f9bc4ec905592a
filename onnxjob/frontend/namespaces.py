"""Small `flow.*` namespaces that are not modules (flow.train, flow.distribute, ...)."""
from onnxjob.errors import missing_api


class ApiNamespace:
    """Attributes given at construction; any other name raises UnsupportedAPIError
    naming `flow.<namespace>.<name>` and the user's line."""

    def __init__(self, name, **members):
        self.__dict__.update(members)
        self._missing = missing_api(name)
        self._name = name

    def __getattr__(self, name):
        return self._missing(name)

    def __repr__(self):
        return f"<{self._name}>"

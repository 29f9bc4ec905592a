"""A dictionary that keeps its most recently used entries: the onnxruntime sessions made
for small graphs on the fly (eager tensors' nodes, eager bodies' values)."""
import collections


class LeastRecentlyUsed(collections.OrderedDict):
    """At most `kept` entries; `get_or_make(key, make)` drops the least recently used."""

    def __init__(self, kept):
        super().__init__()
        self.kept = kept

    def get_or_make(self, key, make):
        """The entry of `key`, made by `make()` if absent, now the most recently used."""
        value = self.get(key)
        if value is None:
            value = self[key] = make()
        self.move_to_end(key)
        while len(self) > self.kept:
            self.popitem(last=False)
        return value

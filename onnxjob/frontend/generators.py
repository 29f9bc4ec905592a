"""`flow.Generator` and `flow.default_generator`: OneFlow's random generators, as a lazy
job sees them.

In OneFlow the default generator holds the process's global seed: `flow.manual_seed(s)`
and `flow.default_generator().manual_seed(s)` are one call. Here that seed is onnxjob's
process seed (`flow.manual_seed` / `flow.config.seed`), from which the sessions started
afterwards draw their initial values and random ops. A generator made with
`flow.Generator()` seeds only what is given it, and no op of a lazy job takes one (in
OneFlow only eager random ops do), so its seed changes no number here either.
"""
import secrets

from onnxjob.frontend.config import process_config

_DEVICES = ("auto", "cpu", "cuda")


def _device_type(device):
    text = "auto" if device is None else str(device)
    kind = text.split(":", 1)[0]
    if kind not in _DEVICES:
        raise ValueError(f"a generator's device is one of {', '.join(_DEVICES)} (optionally "
                         f"'cuda:N'), got {device!r}")
    return kind


class Generator:
    """A random generator: `manual_seed(seed)`, `initial_seed()` and `seed()` as OneFlow's
    (see the module docstring for what its seed reaches)."""

    def __init__(self, device=None):
        self.device = _device_type(device)
        self._seed = None

    def _get(self):
        return self._seed

    def _set(self, seed):
        self._seed = seed

    def manual_seed(self, seed):
        """Set the seed; returns the generator, as OneFlow's does."""
        self._set(int(seed))
        return self

    def initial_seed(self):
        """The seed in force; when none was set, one drawn now and kept."""
        if self._get() is None:
            self._set(secrets.randbits(63))
        return self._get()

    def seed(self):
        """Draw a fresh nondeterministic seed, set it and return it."""
        self._set(secrets.randbits(63))
        return self._get()

    def __repr__(self):
        return f"Generator(device={self.device!r})"


class _DefaultGenerator(Generator):
    """The process's generator: its seed is the process seed (flow.manual_seed)."""

    def _get(self):
        return process_config.random_seed

    def _set(self, seed):
        process_config.random_seed = seed


def create_generator(device=None):
    """`flow.Generator(device=None)`: a new generator ("auto", "cpu" or "cuda")."""
    return Generator(device)


def default_generator(device=None):
    """`flow.default_generator(device=None)`: the generator holding the process seed."""
    return _DefaultGenerator(device)

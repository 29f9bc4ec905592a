"""Every `ONNXJOB_*` environment variable, declared once, parsed and checked when read.

    from onnxjob import settings
    settings.get("NUM_THREADS")      # ONNXJOB_NUM_THREADS as an int, or its default

`get` reads the environment at each call (nothing is cached), so a variable set while the
process runs counts from the next read on. A value the variable does not accept raises
SettingsError (a ValueError) naming the variable, the value and what is expected:

    ONNXJOB_NUM_THREADS='abc': expected an integer >= 0

An empty value counts as unset (the default), except for ONNXJOB_CACHE_DIR where it
turns the cache off, as it always did. An `ONNXJOB_*` variable that is not in the table
is reported once per process, with the closest known name, as a SettingsWarning.

Where a `function_config` flag or `flow.config` setter does the same thing, the
variable is a process-wide stand-in for it; the `overrides` column of the table says
which one wins. `python -m onnxjob settings` prints the table with the current values;
docs/settings.md holds the same table (`python -m onnxjob settings --markdown`).
"""
import difflib
import os
import re
import warnings

PREFIX = "ONNXJOB_"


class SettingsError(ValueError):
    """An `ONNXJOB_*` environment variable holds a value its setting does not accept."""


class SettingsWarning(UserWarning):
    """The environment has `ONNXJOB_*` variables that onnxjob does not know (typos)."""


class Int:
    """An integer within [minimum, maximum] (either bound may be None)."""

    blank_is_unset = True
    _INTEGER = re.compile(r"[+-]?\d+")

    def __init__(self, minimum=None, maximum=None):
        self.minimum, self.maximum = minimum, maximum

    @property
    def expected(self):
        """What the variable takes, in words."""
        bounds = [f">= {self.minimum}" if self.minimum is not None else "",
                  f"<= {self.maximum}" if self.maximum is not None else ""]
        return " ".join(["an integer"] + [b for b in bounds if b])

    def parse(self, text):
        """`text` as an int; ValueError when it is not one or out of bounds."""
        if not self._INTEGER.fullmatch(text.strip()):
            raise ValueError(f"expected {self.expected}")
        value = int(text)
        if (self.minimum is not None and value < self.minimum) or \
                (self.maximum is not None and value > self.maximum):
            raise ValueError(f"expected {self.expected}")
        return value


class Seconds:
    """A duration in seconds, a number > 0."""

    blank_is_unset = True
    expected = "a number of seconds > 0"

    def parse(self, text):
        """`text` as a float; ValueError when it is not a positive finite number."""
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not 0 < value < float("inf"):
            raise ValueError(f"expected {self.expected}")
        return value


class Bool:
    """A switch: 1/true/yes/on or 0/false/no/off (any case)."""

    blank_is_unset = True
    expected = "one of 0/1/true/false/yes/no/on/off"
    _WORDS = {"1": True, "true": True, "yes": True, "on": True,
              "0": False, "false": False, "no": False, "off": False}

    def parse(self, text):
        """`text` as a bool; ValueError for any other word."""
        try:
            return self._WORDS[text.strip().lower()]
        except KeyError:
            raise ValueError(f"expected {self.expected}") from None


class Choice:
    """One of a few words (any case; returned in lower case)."""

    blank_is_unset = True

    def __init__(self, *choices):
        self.choices = choices

    @property
    def expected(self):
        """What the variable takes, in words."""
        return "one of " + ", ".join(self.choices)

    def parse(self, text):
        """`text` lower-cased when it is one of the choices; ValueError otherwise."""
        value = text.strip().lower()
        if value not in self.choices:
            raise ValueError(f"expected {self.expected}")
        return value


class Path:
    """A file or folder path (not checked for existence); with `off` words, those words
    (and the empty value, when "" is one of them) give None instead."""

    def __init__(self, off=()):
        self.off = tuple(off)
        self.blank_is_unset = "" not in self.off

    @property
    def expected(self):
        """What the variable takes, in words."""
        words = [w for w in self.off if w]
        return "a path" + (f", or {'/'.join(words)} (or empty) for off" if words else "")

    def parse(self, text):
        """`text` itself, or None for an off word (any case)."""
        return None if text.strip().lower() in self.off else text


class Names:
    """Comma-separated names, each one of `choices()` (a function, called when a value is
    parsed, so that the valid names can come from modules imported later). Returns a
    tuple of the names in the order given."""

    blank_is_unset = True

    def __init__(self, choices, what):
        self.choices, self.what = choices, what

    @property
    def expected(self):
        """What the variable takes, in words (every valid name)."""
        return f"comma-separated {self.what} from: {', '.join(sorted(self.choices()))}"

    def parse(self, text):
        """The names in `text`; ValueError naming the first unknown one and listing all."""
        names = tuple(n.strip() for n in text.split(",") if n.strip())
        valid = sorted(self.choices())
        for name in names:
            if name not in valid:
                raise ValueError(f"unknown name {name!r}{_did_you_mean(name, valid)}; "
                                 f"expected {self.expected}")
        return names


class Setting:
    """One `ONNXJOB_<name>` variable: its parser, default (a value, or a function of no
    arguments computing it), one-line description and the function_config flag or
    flow.config setter it stands in for ("" if none)."""

    def __init__(self, name, parser, default, description, overrides="", default_text=None):
        self.name, self.parser, self.default = name, parser, default
        self.description, self.overrides = description, overrides
        self._default_text = default_text

    @property
    def variable(self):
        """The environment variable's full name."""
        return PREFIX + self.name

    @property
    def default_text(self):
        """The default, as the table shows it."""
        if self._default_text is not None:
            return self._default_text
        if isinstance(self.default, bool):
            return "1" if self.default else "0"
        return "unset" if self.default is None else str(self.default)

    def default_value(self):
        """The value when the variable is unset."""
        return self.default() if callable(self.default) else self.default

    def read(self, environ=None):
        """The parsed value from `environ` (os.environ by default), else the default."""
        text = (os.environ if environ is None else environ).get(self.variable)
        if text is None or (not text.strip() and self.parser.blank_is_unset):
            return self.default_value()
        try:
            return self.parser.parse(text)
        except ValueError as e:
            raise SettingsError(f"{self.variable}={text!r}: {e}") from None


def _default_pass_names():
    # imported when a value is checked: the pass classes are not needed before
    from onnxjob.passes.default_pipeline import default_pass_names
    return default_pass_names()


def _default_cache_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "onnxjob")


def _default_decode_threads():
    # NOTE: Pillow's decoders and NumPy's loops release the GIL, the Python around them per
    # image does not: on 2 cores, 2 threads decode a batch of 256x256 JPEGs in 0.83x the
    # time of 1 and 4 gain nothing, so a few threads suffice (bench/bench_pipeline.py).
    return min(4, os.cpu_count() or 1)


_TABLE = [
    Setting("DEVICE", Choice("cpu", "cuda", "gpu"), None,
            "Device of the session's jobs; unset: cuda when onnxruntime can use it, else cpu "
            "(with a warning when a GPU is present but unusable; cpu silences it).",
            "function_config.execution_provider wins", "auto"),
    Setting("NUM_THREADS", Int(minimum=0), 0,
            "onnxruntime intra-op threads per session; 0: onnxruntime's choice (the cores)."),
    Setting("SPIN_US", Int(minimum=0), 100,
            "Microseconds an idle intra-op thread spins before it sleeps."),
    Setting("DETERMINISTIC", Bool(), False,
            "onnxruntime's deterministic compute (no atomics, fixed cuDNN algorithms).",
            "either this or function_config.cudnn_conv_use_deterministic_algo_only(True) "
            "turns it on"),
    Setting("CUDA_TF32", Bool(), None,
            "TF32 convolutions and matmuls on the CUDA EP; unset: onnxruntime's default (on).",
            "flow.config.enable_tensor_float_32_compute wins"),
    Setting("ARENA_RESERVE", Bool(), True,
            "Before a process's first train step, make one region of the shared arena of the "
            "step's planned peak (runtime/arena_reserve.py); 0: the arena grows tensor by "
            "tensor."),
    Setting("CUDA_SHARED_ARENA", Bool(), True,
            "CUDA sessions share one arena per GPU (as CPU sessions do), which ARENA_RESERVE "
            "then sizes; 0: each session has its own, grown tensor by tensor."),
    Setting("CUDA_GRAPH", Bool(), True,
            "Run eligible CUDA train steps as CUDA graph replays.",
            "either this or function_config.enable_cuda_graph(False) turns them off"),
    Setting("FREEZE_AFTER", Int(minimum=0), 8,
            "Calls of a predict job with unchanged variables before they are baked in as "
            "constants; 0: never.",
            "function_config.freeze_variables_after wins"),
    Setting("PREFETCH", Int(minimum=0), 2,
            "Batches a job that makes its own data prepares ahead; 0: inline.",
            "function_config.prefetch wins"),
    Setting("DECODE_THREADS", Int(minimum=1), _default_decode_threads,
            "Threads decoding a batch of images.", "", "min(4, cores)"),
    Setting("CACHE_DIR", Path(off=("", "0", "off")), _default_cache_dir,
            "Folder of the optimized-model and pass caches; off, 0 or empty: no cache.",
            "", "$XDG_CACHE_HOME/onnxjob, else ~/.cache/onnxjob"),
    Setting("CACHE_MB", Int(minimum=0), 1024,
            "Size limit of the cache folder in megabytes (least recently used dropped first)."),
    Setting("DISABLE_PASSES", Bool(), False,
            "Skip onnxjob's graph passes (debugging).",
            "either this or function_config.disable_passes(True) turns them off"),
    Setting("SKIP_PASSES", Names(_default_pass_names, "default pass class names"), (),
            "Leave these default passes out (to measure or debug one pass).", "", "none"),
    Setting("DUMP_PASSES", Path(), None,
            "Folder where each job's graph is written before and after the passes.",
            "function_config.dump_passes wins"),
    Setting("CONV_WGRAD", Choice("gather", "im2col", "conv", "batch-last"), "gather",
            "Formulation of a group-1 convolution's weight gradient."),
    Setting("SYNC_BATCH_NORM", Bool(), None,
            "Data-parallel batch norm: 1 the whole batch's statistics, 0 each rank's own; "
            "unset: as OneFlow, the whole batch's on CPU ranks, each rank's own on GPUs."),
    Setting("DIST_TIMEOUT", Seconds(), 120.0,
            "Seconds a data-parallel collective waits for the other ranks.", "", "120"),
    Setting("MNIST", Path(), None,
            "A local mnist.npz that load_mnist reads when out_dir has none (no download)."),
    Setting("CHECKPOINT_FAULT_POINT", Choice("after_first_variable", "before_rename"), None,
            "Tests only: flow.checkpoint.save announces this point on stderr and waits there "
            "to be killed (io/checkpoint.py, fault_point)."),
]

SETTINGS = {s.name: s for s in _TABLE}
_warned_unknown = False


def get(name):
    """The value of `ONNXJOB_<name>` (e.g. get("NUM_THREADS")), parsed now from the
    environment, or the setting's default. Raises SettingsError for a bad value and
    KeyError for a name not in the table. The first call in a process warns about unknown
    `ONNXJOB_*` variables (see unknown_variables)."""
    setting = SETTINGS[name]
    _warn_unknown_once()
    return setting.read()


def unknown_variables(environ=None):
    """{unknown ONNXJOB_* variable in `environ` (os.environ): closest known name or None}."""
    environ = os.environ if environ is None else environ
    found = {}
    for variable in sorted(environ):
        name = variable[len(PREFIX):]
        if variable.startswith(PREFIX) and name not in SETTINGS:
            # compared without the prefix, which every name shares
            close = difflib.get_close_matches(name, SETTINGS, n=1)
            found[variable] = PREFIX + close[0] if close else None
    return found


def _did_you_mean(name, known):
    close = difflib.get_close_matches(name, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _warn_unknown_once():
    global _warned_unknown
    if _warned_unknown:
        return
    _warned_unknown = True
    unknown = unknown_variables()
    if unknown:
        listed = ", ".join(v + (f" (did you mean {c}?)" if c else "") for v, c in unknown.items())
        warnings.warn(f"onnxjob ignores unknown environment variables: {listed}; "
                      "`python -m onnxjob settings` lists the known ones",
                      SettingsWarning, stacklevel=3)


def reset():
    """Make the next `get` check the environment for unknown variables again (tests)."""
    global _warned_unknown
    _warned_unknown = False


def markdown_table():
    """The table of every variable in Markdown (docs/settings.md holds this text)."""
    rows = ["| Variable | Takes | Default | Overrides | What it does |",
            "|---|---|---|---|---|"]
    for s in _TABLE:
        cells = [f"`{s.variable}`", s.parser.expected, s.default_text, s.overrides or "-",
                 s.description]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n"


def describe(environ=None):
    """Each variable with its current value (or its default), what it takes and what it
    does, then any unknown ONNXJOB_* variables: the text `python -m onnxjob settings`
    prints. A bad value is shown with its error instead of raising."""
    environ = os.environ if environ is None else environ
    lines = []
    for s in _TABLE:
        if s.variable in environ:
            try:
                current = f"{s.read(environ)!r} (set: {environ[s.variable]!r})"
            except SettingsError as e:
                current = f"INVALID: {e}"
        else:
            current = f"{s.default_value()!r} (default: {s.default_text})"
        lines.append(f"{s.variable} = {current}")
        lines.append(f"    {s.description}")
        lines.append(f"    takes {s.parser.expected}"
                     + (f"; {s.overrides}" if s.overrides else ""))
    for variable, close in unknown_variables(environ).items():
        lines.append(f"{variable}: unknown, ignored"
                     + (f" (did you mean {close}?)" if close else ""))
    return "\n".join(lines)

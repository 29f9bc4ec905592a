"""Checkpoints in OneFlow's on-disk layout (spec §6).

    <root>/<variable name>/out    raw little-endian bytes, C order
    <root>/<variable name>/meta   text proto: shape { dim: .. } data_type: kFloat
    <root>/snapshot_done          empty file: the save completed

`save` writes into a temporary sibling directory and renames it into place, so a crash
leaves no directory that `get` would accept. Nothing is ever unpickled.
"""
import os
import re
import shutil
import sys
import tempfile
import time

import numpy as np

from onnxjob import dtypes, settings
from onnxjob.errors import CheckpointError, missing_api
from onnxjob.frontend.config import process_config, started_session
from onnxjob.runtime.session import default_session
from onnxjob.runtime import backend, distributed
from onnxjob.source_info import user_location

# a meta file is a VariableMetaInfo in protobuf's text format: `dim: 2` per axis or the
# list form `dim: [2, 3]`; the data_type by name (`kFloat`) or by number (`2`)
_META_DIM = re.compile(r"dim:\s*(?:\[([^\]]*)\]|(-?\d+))")
_META_TYPE = re.compile(r"data_type:\s*(k\w+|\d+)")


def _meta_shape(text):
    dims = []
    for listed, single in _META_DIM.findall(text):
        dims += [int(d) for d in listed.split(",") if d.strip()] if listed else [int(single)]
    return tuple(dims)


class FileBackedVariable:
    """A lazily read checkpoint entry: `.shape`, `.dtype`, `.numpy()`, and OneFlow's
    `.file_path` (its `out` file)."""

    def __init__(self, directory):
        self.directory = directory
        self.name = os.path.basename(directory)
        meta = os.path.join(directory, "meta")
        self._has_meta = os.path.isfile(meta)
        self._shape = self._dtype = None
        if self._has_meta:
            with open(meta) as f:
                text = f.read()
            kind = _META_TYPE.search(text)
            if kind is None:
                raise CheckpointError(f"{meta}: no data_type in the meta file")
            self._shape = _meta_shape(text)
            try:
                self._dtype = dtypes.from_oneflow_enum(kind.group(1))
            except ValueError as e:
                raise CheckpointError(f"{meta}: {e}") from None

    @property
    def shape(self):
        return self._shape

    @property
    def dtype(self):
        return self._dtype

    @property
    def file_path(self):
        return os.path.join(self.directory, "out")

    def numpy(self, shape=None, np_dtype=None):
        if not self._has_meta and (shape is None or np_dtype is None):
            raise RuntimeError("This variable does not have meta info")
        shape = self._shape if self._has_meta else tuple(shape)
        np_dtype = self._dtype.np_dtype if self._has_meta else np.dtype(np_dtype)
        path = self.file_path
        expected = int(np.prod(shape)) * np_dtype.itemsize
        size = os.path.getsize(path)
        if size != expected:
            raise CheckpointError(f"{path}: {size} bytes, expected {expected} for shape {shape} "
                                  f"and dtype {np_dtype} (truncated or wrong file)")
        return np.fromfile(path, dtype=np_dtype.newbyteorder("<")).astype(np_dtype).reshape(shape)


def get(path):
    """`flow.checkpoint.get`: the variables saved under `path` (`read`), once the session
    has started (as OneFlow's GetCheckpoint, @try_init_default_session)."""
    started_session(sync=False)
    return read(path)


def read(path):
    """`flow.load`: the variables saved under `path`, read without starting the session (as
    OneFlow's check_point_v2.Load: jobs may still be defined after it): {name: entry} for
    every subfolder that holds an `out` file (or one entry if path/out exists). As OneFlow's
    loader, neither `snapshot_done` nor the `meta` files are needed (a script that writes
    `<name>/out` files itself leaves them out); an entry without `meta` takes its shape and
    dtype from the variable it is loaded into. (onnxjob's own saves are atomic: a save that
    did not complete leaves no folder at its target, only its temporary folder, which is
    refused.)"""
    if not os.path.isdir(path):
        raise AssertionError(f"Directory {path} doesn't exist!")
    if os.path.basename(os.path.normpath(path)).startswith(SAVE_PREFIX) and \
            not os.path.isfile(os.path.join(path, "snapshot_done")):
        raise CheckpointError(f"{path} is the temporary folder of a save that did not complete "
                              "(no snapshot_done): its variables may be partly written")
    if os.path.isfile(os.path.join(path, "out")):
        return FileBackedVariable(path)
    entries = {}
    for name in sorted(os.listdir(path)):
        sub = os.path.join(path, name)
        # (a symbolic link to a variable's folder counts, as OneFlow's os.path.isfile follows it)
        if os.path.isdir(sub) and os.path.isfile(os.path.join(sub, "out")):
            entries[name] = FileBackedVariable(sub)
    return entries


class VariableValue:
    """A value from get_all_variables(): the variable itself, as OneFlow's (a reference to
    its storage, interface_op_read_and_write.py): `.numpy()` is a copy of its value when
    called, after the steps run so far (a dict held across training or a load saves what
    the variables hold then), `.shape`, `.dtype`."""

    def __init__(self, session, name):
        self._session, self._name = session, name

    def numpy(self):
        self._session.sync()
        return self._session.variable_numpy(self._name)

    @property
    def shape(self):
        return self._session.variable_specs[self._name].shape

    @property
    def dtype(self):
        return dtypes.from_numpy(self._session.variable_specs[self._name].np_dtype)


def get_all_variables():
    """Every variable of every job, optimizer state and train-step counters included."""
    session = started_session(sync=True)
    return {name: VariableValue(session, name) for name in session.variable_specs}


def value_array(name, value, spec):
    """The array `value` holds for variable `name`, checked against its spec (shape and
    dtype, exactly: spec §6.1); errors name the variable and, for a checkpoint entry, its
    file. Returns (array, whether onnxjob made it: no copy is needed to keep it)."""
    where = f"variable {name!r}"
    if isinstance(value, FileBackedVariable):
        where += f", file {os.path.join(value.directory, 'out')}"
        if value.shape is not None:     # meta known: checked before reading the bytes
            _check(value.shape, value.dtype.np_dtype, spec, where)
        try:
            array = value.numpy(spec.shape, spec.np_dtype)
        except OSError as e:
            raise CheckpointError(f"cannot read {where}: {e}") from None
        return array, True
    if hasattr(value, "numpy") and not isinstance(value, np.ndarray):
        array = np.asarray(value.numpy())
    else:
        array = np.asarray(value)
    _check(array.shape, array.dtype, spec, where)
    return array, False


def _check(shape, np_dtype, spec, where):
    if tuple(shape) != spec.shape:
        raise AssertionError(f"{tuple(shape)} vs {spec.shape} ({where})")
    if np_dtype != spec.np_dtype:
        raise AssertionError(f"{dtypes.from_numpy(np_dtype)!r} vs "
                             f"{dtypes.from_numpy(spec.np_dtype)!r} ({where})")


def _oneflow_amsgrad_slot(name, variable_specs):
    """Whether `name` is the `<variable>-max_v` slot OneFlow 0.5's Adam keeps beside `-m`
    and `-v` (adam_optm.cpp; zeros: its legacy API has no amsgrad), which onnxjob's Adam
    does without: its checkpoints load, also with ignore_mismatch=False."""
    return name.endswith("-max_v") and f"{name[:-len('-max_v')]}-v" in variable_specs


def load_variables(value_dict, ignore_mismatch=True):
    """Assign variables by name; unknown names are skipped (or raise). All or nothing:
    every value is read and checked before the first is assigned, so a bad entry (wrong
    shape or dtype, a truncated file) leaves every variable as it was."""
    session = started_session(sync=True)
    names, stored = [], []
    for name, value in value_dict.items():
        spec = session.variable_specs.get(name)
        if spec is None:
            if not ignore_mismatch and not _oneflow_amsgrad_slot(name, session.variable_specs):
                raise RuntimeError(f'"{name}" is not a variable name')
            continue
        array, owned = value_array(name, value, spec)
        names.append(name)
        stored.append(backend.to_device(array, session.device, fresh=owned))
    session.variable_values.replace_all(names, stored)


def _safe_child(root, name):
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise CheckpointError(f"variable name {name!r} cannot be a checkpoint directory name")
    return os.path.join(root, name)


def save(path, var_dict=None):
    """Write every variable to `path` atomically (refuses a file or non-empty directory).
    In a data-parallel run only rank 0 writes (the ranks hold the same values) and every
    rank returns once the checkpoint is there."""
    session = started_session(sync=True)
    if session.data_parallel:
        if distributed.world()[0] == 0:
            try:
                _write(path, session, var_dict)
            finally:
                distributed.barrier()
        else:
            distributed.barrier()
        return
    _write(path, session, var_dict)


def save_var_dict(obj, save_dir=None):
    """`flow.save(obj, save_dir)`: OneFlow's top-level form of `save`, the variables (a
    dict of name to variable, as flow.get_all_variables() gives) first, then the folder.
    A folder first (flow.checkpoint.save's order, `save_dir` then a dict or None) is taken
    too."""
    if isinstance(obj, (str, os.PathLike)) and not isinstance(save_dir, (str, os.PathLike)):
        obj, save_dir = save_dir, obj
    if not isinstance(save_dir, (str, os.PathLike)):
        raise TypeError(f"{user_location()}: flow.save(obj, save_dir) takes the folder to "
                        f"write as save_dir, got {type(save_dir).__name__}")
    if obj is not None and not default_session().is_running:
        # values given before the session started (OneFlow's save starts none): written
        # as they are
        _write(save_dir, None, obj)
        return
    save(save_dir, obj)


FAULT_POINT_ANNOUNCEMENT = "onnxjob checkpoint fault point:"
# the name of a save's temporary folder begins so (renamed to the target once complete)
SAVE_PREFIX = ".onnxjob-save-"


def fault_point(name, folder):
    """A place in `save` where a test can kill the process, for crash tests of its
    atomicity. When ONNXJOB_CHECKPOINT_FAULT_POINT names this point, save writes
    `onnxjob checkpoint fault point: <name> <folder>` (FAULT_POINT_ANNOUNCEMENT, the point
    and the temporary folder being written) to stderr and waits there until it is killed.
    The points: "after_first_variable" (the first variable's `out` and `meta` are written,
    the others are not) and "before_rename" (the temporary folder is complete, snapshot_done
    included, and the next step renames it into place). Unset, a point costs one lookup of
    the environment."""
    if settings.get("CHECKPOINT_FAULT_POINT") != name:
        return
    sys.stderr.write(f"{FAULT_POINT_ANNOUNCEMENT} {name} {folder}\n")
    sys.stderr.flush()
    while True:
        time.sleep(60)


def _write(path, session, var_dict):
    if os.path.isfile(path) or (os.path.isdir(path) and os.listdir(path)):
        raise AssertionError(f"Non-empty directory {path} already exists!")
    if var_dict is None:
        var_dict = {n: session.variable_numpy(n) for n in session.variable_specs}
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=SAVE_PREFIX, dir=parent)
    try:
        for name, value in var_dict.items():
            array = np.asarray(value.numpy() if hasattr(value, "numpy") else value, order="C")
            d = _safe_child(tmp, name)
            os.makedirs(d)
            array.astype(array.dtype.newbyteorder("<")).tofile(os.path.join(d, "out"))
            dims = "".join(f"  dim: {int(x)}\n" for x in array.shape)
            with open(os.path.join(d, "meta"), "w") as f:
                f.write(f"shape {{\n{dims}}}\ndata_type: {dtypes.from_numpy(array.dtype).oneflow_enum}\n")
            fault_point("after_first_variable", tmp)
        open(os.path.join(tmp, "snapshot_done"), "w").close()
        if os.path.isdir(path):
            os.rmdir(path)
        fault_point("before_rename", tmp)
        os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class CheckPoint:
    """Old API: `save(path)`, `load(path)`, `init()` over the v2 functions (§6.3)."""

    def __init__(self):
        if process_config.legacy_model_io:   # (OneFlow's check_point.py says nothing then)
            return
        print("\033[1mWARNING: 'flow.train.CheckPoint' is deprecated. Please use the new API:\033[0m\n"
              "flow.train.CheckPoint().save(path) => \033[1mflow.checkpoint.save(path)\033[0m\n"
              "flow.train.CheckPoint().load(path) => \033[1mflow.load_variables(flow.checkpoint.get(path))\033[0m\n"
              "flow.train.CheckPoint().init() is not needed any more.")

    def save(self, path):
        assert isinstance(path, str), "CheckPoint.save takes a str path"
        save(path)

    def load(self, path):
        """The checkpoint's variables; with legacy model io, as OneFlow's model-load job,
        a variable the folder lacks is initialized again (model_load_kernel.cpp)."""
        assert isinstance(path, str), "CheckPoint.load takes a str path"
        values = get(path)
        if process_config.legacy_model_io:
            session = started_session(sync=True)
            session.reinitialize(n for n in session.variable_specs if n not in values)
        load_variables(values)

    def init(self):
        """Nothing with the v2 model io (the variables start initialized); with legacy
        model io, as OneFlow's model-init job, every variable (optimizer state and train
        step included) is set back to its initial value."""
        session = started_session(sync=False)
        if process_config.legacy_model_io:
            session.reinitialize(list(session.variable_specs))


__getattr__ = missing_api("flow.checkpoint")

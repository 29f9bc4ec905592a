"""onnxjob/settings.py: the one table of ONNXJOB_* environment variables, their parsers,
the unknown-variable warning, the consumers reading through it, and docs/settings.md."""
import ast
import os
import re
import warnings

import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob import passes, settings
from onnxjob.__main__ import main
from onnxjob.settings import SettingsError, SettingsWarning

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "onnxjob")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    """No ONNXJOB_* variable but the test cache folder; the unknown-variable check re-armed."""
    for variable in list(os.environ):
        if variable.startswith("ONNXJOB_") and variable != "ONNXJOB_CACHE_DIR":
            monkeypatch.delenv(variable)
    settings.reset()
    yield
    settings.reset()


def _error(monkeypatch, name, value):
    monkeypatch.setenv("ONNXJOB_" + name, value)
    with pytest.raises(SettingsError) as caught:
        settings.get(name)
    return str(caught.value)


def test_defaults(monkeypatch):
    monkeypatch.delenv("ONNXJOB_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", "/somewhere")
    expected = {
        "DEVICE": None, "NUM_THREADS": 0, "SPIN_US": 100, "DETERMINISTIC": False,
        "CUDA_TF32": None, "ARENA_RESERVE": True, "CUDA_SHARED_ARENA": True,
        "CUDA_GRAPH": True, "FREEZE_AFTER": 8, "PREFETCH": 2,
        "DECODE_THREADS": min(4, os.cpu_count() or 1), "CACHE_DIR": "/somewhere/onnxjob",
        "CACHE_MB": 1024, "DISABLE_PASSES": False, "SKIP_PASSES": (), "DUMP_PASSES": None,
        "CONV_WGRAD": "gather", "SYNC_BATCH_NORM": None, "DIST_TIMEOUT": 120.0, "MNIST": None,
        "CHECKPOINT_FAULT_POINT": None}
    assert {name: settings.get(name) for name in settings.SETTINGS} == expected
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert settings.get("CACHE_DIR") == os.path.join(os.path.expanduser("~"), ".cache",
                                                     "onnxjob")


def test_values_are_read_at_each_call(monkeypatch):
    monkeypatch.setenv("ONNXJOB_NUM_THREADS", "3")
    assert settings.get("NUM_THREADS") == 3
    monkeypatch.setenv("ONNXJOB_NUM_THREADS", " 5 ")
    assert settings.get("NUM_THREADS") == 5
    monkeypatch.setenv("ONNXJOB_NUM_THREADS", "")
    assert settings.get("NUM_THREADS") == 0, "an empty value is the default"


def test_a_name_not_in_the_table_is_a_key_error():
    with pytest.raises(KeyError):
        settings.get("NUM_THREAD")


@pytest.mark.parametrize("value", ["abc", "1.5", "3_0", "0x10", "2 3"])
def test_a_bad_integer_names_variable_value_and_expectation(monkeypatch, value):
    assert _error(monkeypatch, "NUM_THREADS", value) == \
        f"ONNXJOB_NUM_THREADS={value!r}: expected an integer >= 0"


def test_an_integer_out_of_range_is_refused(monkeypatch):
    assert _error(monkeypatch, "NUM_THREADS", "-1") == \
        "ONNXJOB_NUM_THREADS='-1': expected an integer >= 0"
    assert _error(monkeypatch, "DECODE_THREADS", "0") == \
        "ONNXJOB_DECODE_THREADS='0': expected an integer >= 1"


def test_setting_error_is_a_value_error():
    assert issubclass(SettingsError, ValueError)


@pytest.mark.parametrize("word, value", [("1", True), ("TRUE", True), ("yes", True),
                                         ("On", True), ("0", False), ("false", False),
                                         ("NO", False), ("off", False)])
def test_switch_words(monkeypatch, word, value):
    monkeypatch.setenv("ONNXJOB_DETERMINISTIC", word)
    assert settings.get("DETERMINISTIC") is value


def test_a_bad_switch_is_refused(monkeypatch):
    assert _error(monkeypatch, "CUDA_GRAPH", "maybe") == \
        "ONNXJOB_CUDA_GRAPH='maybe': expected one of 0/1/true/false/yes/no/on/off"


def test_choices(monkeypatch):
    monkeypatch.setenv("ONNXJOB_DEVICE", "CPU")
    assert settings.get("DEVICE") == "cpu"
    assert _error(monkeypatch, "DEVICE", "tpu") == \
        "ONNXJOB_DEVICE='tpu': expected one of cpu, cuda, gpu"
    assert _error(monkeypatch, "CONV_WGRAD", "fft") == \
        "ONNXJOB_CONV_WGRAD='fft': expected one of gather, im2col, conv, batch-last"


def test_seconds(monkeypatch):
    monkeypatch.setenv("ONNXJOB_DIST_TIMEOUT", "2.5")
    assert settings.get("DIST_TIMEOUT") == 2.5
    for bad in ("0", "-3", "soon", "inf", "nan"):
        assert _error(monkeypatch, "DIST_TIMEOUT", bad) == \
            f"ONNXJOB_DIST_TIMEOUT={bad!r}: expected a number of seconds > 0"


@pytest.mark.parametrize("value, folder", [("", None), ("0", None), ("OFF", None),
                                           ("/tmp/x", "/tmp/x")])
def test_the_cache_folder_and_its_off_words(monkeypatch, value, folder):
    monkeypatch.setenv("ONNXJOB_CACHE_DIR", value)
    assert settings.get("CACHE_DIR") == folder


def test_skipped_passes_are_default_pass_class_names(monkeypatch):
    monkeypatch.setenv("ONNXJOB_SKIP_PASSES", " FoldReshapes, AlignBroadcastRanks ,")
    assert settings.get("SKIP_PASSES") == ("FoldReshapes", "AlignBroadcastRanks")
    names = [type(p).__name__ for p in passes.default_passes("cpu")]
    assert "FoldReshapes" not in names and "AlignBroadcastRanks" not in names
    assert "FoldTransposeIntoGemm" in names


def test_an_unknown_pass_name_is_refused_with_the_valid_ones(monkeypatch):
    message = _error(monkeypatch, "SKIP_PASSES", "FoldReshapes,FoldReshape")
    assert message.startswith("ONNXJOB_SKIP_PASSES='FoldReshapes,FoldReshape': unknown name "
                              "'FoldReshape' (did you mean 'FoldReshapes'?); expected ")
    for name in passes.default_pass_names():
        assert name in message
    assert {"KeepOnCuda", "ReluMaskAsMul", "TopologicalSortPass"} <= set(
        passes.default_pass_names()), "both devices' pipelines count"
    with pytest.raises(SettingsError, match="ONNXJOB_SKIP_PASSES"):
        passes.default_passes("cpu")


def test_disable_and_dump_passes(monkeypatch, tmp_path):
    assert not passes.passes_disabled() and passes.dump_folder() is None
    monkeypatch.setenv("ONNXJOB_DISABLE_PASSES", "yes")
    monkeypatch.setenv("ONNXJOB_DUMP_PASSES", str(tmp_path))
    assert passes.passes_disabled()
    assert passes.dump_folder() == str(tmp_path)
    config = flow.function_config()
    config.dump_passes("elsewhere")
    assert passes.dump_folder(config) == "elsewhere", "the function_config flag wins"


def test_unknown_variables_warn_once_with_the_closest_name(monkeypatch):
    monkeypatch.setenv("ONNXJOB_DEVCE", "cpu")
    monkeypatch.setenv("ONNXJOB_ZZZ", "1")
    with pytest.warns(SettingsWarning) as caught:
        settings.get("NUM_THREADS")
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "ONNXJOB_DEVCE (did you mean ONNXJOB_DEVICE?)" in message
    assert "ONNXJOB_ZZZ" in message and "ONNXJOB_ZZZ (" not in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        settings.get("NUM_THREADS")      # once per process: no second warning
    assert settings.unknown_variables() == {"ONNXJOB_DEVCE": "ONNXJOB_DEVICE",
                                            "ONNXJOB_ZZZ": None}


def test_known_variables_do_not_warn(monkeypatch):
    monkeypatch.setenv("ONNXJOB_DEVICE", "cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert settings.get("DEVICE") == "cpu"


def test_a_session_refuses_a_bad_thread_count_with_the_clear_error(monkeypatch):
    monkeypatch.setenv("ONNXJOB_NUM_THREADS", "abc")

    @flow.global_function(type="predict")
    def double(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        return x * 2
    with pytest.raises(SettingsError, match=r"^ONNXJOB_NUM_THREADS='abc': expected an integer"):
        double(np.ones((2, 3), np.float32))


def test_a_job_refuses_an_unknown_skipped_pass(monkeypatch):
    monkeypatch.setenv("ONNXJOB_SKIP_PASSES", "FoldReshape")

    @flow.global_function(type="predict")
    def double(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        return x * 2
    with pytest.raises(SettingsError, match="did you mean 'FoldReshapes'"):
        double(np.ones((2, 3), np.float32))


def test_session_options_follow_the_variables(monkeypatch):
    from onnxjob.runtime import backend
    opts = backend.session_options(False)
    assert not opts.use_deterministic_compute and opts.intra_op_num_threads == 0
    assert opts.get_session_config_entry("session.intra_op.spin_duration_us") == "100"
    monkeypatch.setenv("ONNXJOB_DETERMINISTIC", "on")
    monkeypatch.setenv("ONNXJOB_NUM_THREADS", "2")
    monkeypatch.setenv("ONNXJOB_SPIN_US", "0")
    opts = backend.session_options(False)
    assert opts.use_deterministic_compute and opts.intra_op_num_threads == 2
    assert opts.get_session_config_entry("session.intra_op.spin_duration_us") == "0"
    assert backend.session_options(False, threads=3).intra_op_num_threads == 3


def test_tf32_variable_stands_in_for_the_flow_config_setter(monkeypatch):
    from onnxjob.runtime import backend
    config = flow.function_config()
    assert "use_tf32" not in backend.cuda_provider_options(config)
    monkeypatch.setenv("ONNXJOB_CUDA_TF32", "false")
    assert backend.cuda_provider_options(config)["use_tf32"] == "0"
    assert backend.cuda_provider_options(config, tf32=True)["use_tf32"] == "1", \
        "flow.config.enable_tensor_float_32_compute wins"


def test_flags_win_over_count_variables(monkeypatch):
    from onnxjob.runtime import distributed, frozen, pipeline
    monkeypatch.setenv("ONNXJOB_FREEZE_AFTER", "3")
    monkeypatch.setenv("ONNXJOB_PREFETCH", "0")
    monkeypatch.setenv("ONNXJOB_DIST_TIMEOUT", "7")
    config = flow.function_config()
    assert frozen.freeze_threshold(config) == 3 and pipeline.prefetch_depth(config) == 0
    config.freeze_variables_after(5)
    config.prefetch(4)
    assert frozen.freeze_threshold(config) == 5 and pipeline.prefetch_depth(config) == 4
    assert distributed._timeout_s() == 7.0


def test_either_the_flag_or_the_variable_turns_cuda_graphs_off(monkeypatch):
    from types import SimpleNamespace
    from onnxjob.runtime import cuda_graph
    compiled = SimpleNamespace(has_sequences=False, model=SimpleNamespace(graph=[]))
    on, off = flow.function_config(), flow.function_config()
    off.enable_cuda_graph(False)
    assert cuda_graph.obstacle(SimpleNamespace(config=on), compiled) is None
    assert cuda_graph.obstacle(SimpleNamespace(config=off), compiled) == ""
    monkeypatch.setenv("ONNXJOB_CUDA_GRAPH", "no")
    assert cuda_graph.obstacle(SimpleNamespace(config=on), compiled) == ""


def _package_files():
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                yield os.path.join(folder, name)


def test_only_settings_reads_onnxjob_variables_from_the_environment():
    """No module but settings.py reads os.environ / os.getenv for an ONNXJOB_* name, or
    names one as a bare string (a key to look up)."""
    offenders = []
    for path in _package_files():
        if path == os.path.join(PACKAGE, "settings.py"):
            continue
        with open(path) as f:
            source = f.read()
        for number, line in enumerate(source.splitlines(), 1):
            if re.search(r"(environ|getenv)\b.*ONNXJOB_", line):
                offenders.append(f"{path}:{number}: {line.strip()}")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                    re.fullmatch(r"ONNXJOB_\w*", node.value):
                offenders.append(f"{path}:{node.lineno}: {node.value!r}")
    assert offenders == []


def test_every_variable_the_package_mentions_is_in_the_table():
    """Docstrings and messages name only declared variables (no typo, no stale name)."""
    mentioned = set()
    for path in _package_files():
        with open(path) as f:
            mentioned |= set(re.findall(r"ONNXJOB_[A-Z0-9_]*[A-Z0-9]", f.read()))
    assert len(mentioned) > 10
    assert mentioned - {s.variable for s in settings.SETTINGS.values()} == set()


def test_the_docs_table_is_the_modules():
    with open(os.path.join(ROOT, "docs", "settings.md")) as f:
        doc = f.read()
    found = re.search(r"<!-- generated by[^\n]*-->\n(.*?)<!-- end of the generated table -->",
                      doc, re.S)
    assert found, "docs/settings.md lost its generated-table markers"
    assert found.group(1) == settings.markdown_table(), (
        "docs/settings.md is stale: paste `python -m onnxjob settings --markdown` into it")


def test_the_settings_command(monkeypatch, capsys):
    monkeypatch.setenv("ONNXJOB_PREFETCH", "3")
    monkeypatch.setenv("ONNXJOB_NUM_THREADS", "x")
    monkeypatch.setenv("ONNXJOB_DEVCE", "cpu")
    main(["settings"])
    out = capsys.readouterr().out
    assert "ONNXJOB_PREFETCH = 3 (set: '3')" in out
    assert "ONNXJOB_FREEZE_AFTER = 8 (default: 8)" in out
    assert "ONNXJOB_NUM_THREADS = INVALID: ONNXJOB_NUM_THREADS='x': expected an integer" in out
    assert "ONNXJOB_DEVCE: unknown, ignored (did you mean ONNXJOB_DEVICE?)" in out
    main(["settings", "--markdown"])
    assert capsys.readouterr().out == settings.markdown_table()

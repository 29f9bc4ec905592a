"""The README: its python snippets run as written, its two commands are the ones .ci/run
runs, and it stays short."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
CI_RUN = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()


def sections():
    """{heading: text} of the README's `## ` sections."""
    parts = re.split(r"^## (.+)$", README, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def code_blocks(text, language):
    return re.findall(rf"^```{language}\n(.*?)^```$", text, flags=re.S | re.M)


# every python block of the README runs; these are what the three uses must print
EXPECTED = {
    "Export a job to ONNX": r"onnxruntime agrees: True",
    "Serve a predict job": r"score: \[0\.7\d*\]",
    "Train as a library": r"test accuracy (9\d|8[5-9])\.\d%",
}
SNIPPETS = [(heading, block) for heading, text in sections().items()
            for block in code_blocks(text, "python")]


def test_the_three_uses_have_snippets():
    assert set(EXPECTED) <= {heading for heading, _ in SNIPPETS}


@pytest.mark.parametrize("heading,code", SNIPPETS, ids=[h for h, _ in SNIPPETS])
def test_python_snippet_runs_as_written(heading, code, tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(EXPECTED.get(heading, ""), done.stdout), done.stdout


def test_readme_is_short():
    assert README.count("\n") <= 160


def test_the_two_commands_are_the_ones_ci_runs():
    setup, tests = (block.strip() for block in code_blocks(sections()["The two commands"], "bash"))
    ci_lines = [line.strip() for line in CI_RUN.splitlines()]
    assert tests == ".venv/bin/python -m pytest -q tests" and tests in ci_lines
    assert setup in ci_lines
    assert setup.startswith("python3 -m venv .venv && ") and "examples/quickstart.py" in setup
    # the setup command needs nothing that only this repository's machines have
    assert "shared" not in setup and "ONNXJOB_MNIST" not in setup
    assert ci_lines.index(setup) < ci_lines.index(tests)


def test_ci_smoke_tests_the_wheel_with_no_extras():
    wheel_install = [line for line in CI_RUN.splitlines() if "pip install" in line and ".whl" in line]
    assert wheel_install and all("[" not in line for line in wheel_install)
    assert ".ci/smoke_wheel.py" in CI_RUN and os.path.isfile(os.path.join(ROOT, ".ci", "smoke_wheel.py"))


def test_the_install_lines_install_from_the_clone():
    """onnxjob is not published: the install commands are the clone's (`pip install .`,
    then the GPU wheel swapped in); the published name is only a future form, in prose."""
    install = sections()["Install"]
    lines = [line.split("#")[0].strip() for block in code_blocks(install, "bash")
             for line in block.splitlines() if line.strip()]
    assert lines == ["pip install .", "pip install . && pip uninstall -y onnxruntime && "
                     "pip install onnxruntime-gpu"]
    assert not any("pip install onnxjob" in block for block in code_blocks(README, "[a-z]*"))
    assert re.search(r"not on PyPI yet", install)

"""How much of OneFlow 0.5's single-client API onnxjob covers.

    python bench/oneflow_coverage.py --oneflow /tmp/of05/python/oneflow/compatible/single_client \
        [--names] [--op-tests] [--jobs 2] [--timeout 120] [--only test_add,test_concat] [--list]

`--oneflow` is the `single_client` folder of a OneFlow release (nothing of OneFlow is
imported or shipped here; get it with e.g.
`git archive v0.5.0 python/oneflow/compatible | tar -x -C /tmp/of05`).

--names     OneFlow's public names, read statically (ast) from the re-export modules of
            single_client (`__init__.py`, math.py, nn/__init__.py, ...: the modules that
            define nothing themselves), checked with getattr on onnxjob under the `oneflow`
            alias. A name raising UnsupportedAPIError with a specific reason counts as
            "refused"; with the generic message, or absent, as "missing".
--op-tests  OneFlow's own legacy op tests (test/ops/test_*.py), each file run by pytest in a
            subprocess under the alias (pytest.main after install_oneflow_alias), with a per-file
            timeout; results per test function from pytest's junit XML. Files excluded by rule
            (multi-device/node, GPU-only, eager, OneFlow CI datasets) are listed; tests that
            flow.unittest skips (skip_unless_1n2d, ...) count as skipped by rule.
"""
import argparse
import ast
import collections
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable

# Packages of single_client that hold the implementation, not the public API.
IMPLEMENTATION = {"framework", "ops", "eager", "support", "test", "benchmarks", "core",
                  "__main__", "vm", "common_types"}


# ----------------------------------------------------------------------------- public names

def _public_names(tree):
    """Names a module binds at top level: imports (by their local name), assignments
    (incl. `locals()["x"] = ...`), defs and classes, less `del`eted and private names.
    Returns {name: module-or-None} where module is the `from X import` source."""
    names = {}

    def visit(body):
        for node in body:
            if isinstance(node, ast.ImportFrom):
                source = ("." * node.level) + (node.module or "")
                if not (node.level or source.startswith("oneflow")):
                    continue  # `from typing import Union` in a helper module: not API
                for alias in node.names:
                    if alias.name != "*":
                        names[alias.asname or alias.name] = (source, alias.name)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        names[target.id] = None
                    elif (isinstance(target, ast.Subscript)
                          and isinstance(target.value, ast.Call)
                          and getattr(target.value.func, "id", None) == "locals"
                          and isinstance(target.slice, ast.Constant)):
                        names[target.slice.value] = None
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names[node.name] = None
            elif isinstance(node, ast.Delete):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        names.pop(target.id, None)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
    visit(tree.body)
    return {n: v for n, v in names.items() if not n.startswith("_")}


def _is_reexport_module(tree):
    return not any(isinstance(n, (ast.FunctionDef, ast.ClassDef)) for n in tree.body)


def api_namespaces(single_client):
    """{dotted namespace ('' for flow itself): file} for flow and its re-export modules."""
    spaces = {"": os.path.join(single_client, "__init__.py")}
    for dirpath, dirnames, filenames in os.walk(single_client):
        rel = os.path.relpath(dirpath, single_client)
        parts = [] if rel == "." else rel.split(os.sep)
        if parts and (parts[0] in IMPLEMENTATION or not os.path.exists(
                os.path.join(dirpath, "__init__.py"))):
            dirnames[:] = []
            continue
        dirnames[:] = [d for d in dirnames if not (not parts and d in IMPLEMENTATION)]
        for filename in filenames:
            if not filename.endswith(".py"):
                continue
            stem = filename[:-3]
            if stem in IMPLEMENTATION:
                continue
            dotted = ".".join(parts + ([] if stem == "__init__" else [stem]))
            if dotted == "":
                continue
            path = os.path.join(dirpath, filename)
            with open(path) as f:
                tree = ast.parse(f.read())
            if _is_reexport_module(tree) and _public_names(tree):
                spaces[dotted] = path
    return spaces


def _is_module_ref(single_client, namespace, binding):
    """Whether `from X import name` binds a module of single_client (a namespace itself)."""
    if not binding:
        return False
    source, name = binding
    if source.startswith("."):
        base = namespace.split(".") if namespace else []
        up = len(source) - len(source.lstrip("."))
        pkg = base[:len(base) - (up - 1)] if up > 1 else base
        # a module's own namespace is its package unless it is an __init__
        mod = pkg + [p for p in source.lstrip(".").split(".") if p]
    elif source.startswith("oneflow.compatible.single_client"):
        mod = source.split(".")[3:]
    else:
        return False
    stem = os.path.join(single_client, *mod, name)
    return os.path.isdir(stem) or os.path.exists(stem + ".py")


def collect_names(single_client):
    """[(namespace, name)] of OneFlow's public single-client API."""
    out = []
    for namespace, path in sorted(api_namespaces(single_client).items()):
        with open(path) as f:
            names = _public_names(ast.parse(f.read()))
        for name, binding in sorted(names.items()):
            if _is_module_ref(single_client, namespace, binding):
                continue
            out.append((namespace, name))
    return out


def check_names(single_client):
    sys.path.insert(0, ROOT)
    from onnxjob.compat import install_oneflow_alias
    from onnxjob.errors import UnsupportedAPIError
    install_oneflow_alias()
    import oneflow.compatible.single_client as flow  # noqa: E402  (the alias)
    generic = "implements OneFlow's single-device legacy job-function API"
    results = collections.defaultdict(list)  # status -> [(dotted, detail)]
    names = collect_names(single_client)
    for namespace, name in names:
        dotted = ".".join(p for p in ("flow", namespace, name) if p)
        obj = flow
        try:
            for part in (namespace.split(".") if namespace else []) + [name]:
                obj = getattr(obj, part)
            results["provided"].append((dotted, ""))
        except UnsupportedAPIError as e:
            status = "missing" if generic in str(e) else "refused"
            results[status].append((dotted, str(e).split(": ", 1)[-1]))
        except Exception as e:  # noqa: BLE001  (an AttributeError, a namespace object, ...)
            results["missing"].append((dotted, f"{type(e).__name__}: {e}"))
    total = len(names)
    print(f"== OneFlow public names ({single_client})")
    print(f"total {total}  provided {len(results['provided'])}  refused-with-reason "
          f"{len(results['refused'])}  missing {len(results['missing'])}  "
          f"provided {100.0 * len(results['provided']) / total:.1f}%")
    for dotted, why in results["refused"]:
        print(f"  refused {dotted}: {why[:160]}")
    by_module = collections.defaultdict(list)
    for dotted, _ in results["missing"]:
        by_module[dotted.rsplit(".", 1)[0]].append(dotted.rsplit(".", 1)[1])
    print("missing, by module:")
    for module, members in sorted(by_module.items(), key=lambda kv: -len(kv[1])):
        print(f"  {module} ({len(members)}): {', '.join(members)}")
    return results


# ----------------------------------------------------------------------------- op tests

# Files not run, by rule (matched on the file name or its source).
FILE_RULES = [
    ("multi-device/node", re.compile(r"multi_process|two_node|all_reduce_group|boxing|"
                                     r"copy_comm_net|model_parallel|_ms\.py$|"
                                     r"distribute_concat|hierarchical_parallel|"
                                     r"nccl|parallel_cast|optimizer_placement"), None),
    ("GPU-only kernel", re.compile(r"gpu|nvtx|bfloat16|memory_zone|fuse_cast_scale"), None),
    # (eager job functions run, blob.numpy() in their bodies included; eager tensors not)
    ("eager tensors", None, re.compile(r"flow\.nn\.Parameter|flow\.Tensor\(")),
    ("OneFlow CI dataset", None, re.compile(r"[\"']/dataset")),
]


def select_files(ops_dir):
    selected, excluded = [], collections.defaultdict(list)
    for filename in sorted(os.listdir(ops_dir)):
        if not (filename.startswith("test_") and filename.endswith(".py")):
            continue
        if filename in ("test_util.py", "test_global_storage.py"):
            continue
        with open(os.path.join(ops_dir, filename)) as f:
            source = f.read()
        for rule, name_re, source_re in FILE_RULES:
            if (name_re and name_re.search(filename)) or (source_re and source_re.search(source)):
                excluded[rule].append((filename, count_tests(source)))
                break
        else:
            selected.append(filename)
    return selected, excluded


def count_tests(source):
    """Test functions the runner collects: test_* methods of Test* classes, test_* defs
    that do not take OneFlow's `test_case` argument (see _LAUNCH)."""
    n = 0
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef):
            n += sum(1 for m in node.body
                     if isinstance(m, ast.FunctionDef) and m.name.startswith("test"))
        elif isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            n += "test_case" not in [a.arg for a in node.args.args]
    return n


# pytest in a process where `import oneflow` is onnxjob and the names NumPy and Python
# removed since OneFlow's releases answer as then (what `python -m onnxjob run` does:
# compat/removed_names.py; the test code uses np.float and collections.Sized). Module-level
# functions taking OneFlow's `test_case` argument are not collected: they are helpers the
# TestCase methods call (OneFlow ran its tests with unittest, which collects only TestCase
# methods), not tests.
_LAUNCH = ("import sys, pytest\n"
           "class _UnittestCollection:\n"
           "    def pytest_collection_modifyitems(self, config, items):\n"
           "        helpers = [i for i in items if getattr(i, 'cls', 0) is None\n"
           "                   and 'test_case' in getattr(i, 'fixturenames', ())]\n"
           "        if helpers:\n"
           "            config.hook.pytest_deselected(items=helpers)\n"
           "            items[:] = [i for i in items if i not in helpers]\n"
           "from onnxjob.compat import install_for_oneflow_scripts\n"
           "install_for_oneflow_scripts()\n"
           "sys.exit(pytest.main(sys.argv[1:], plugins=[_UnittestCollection()]))\n")


def run_file(workdir, filename, timeout):
    xml = os.path.join(workdir, "_junit", filename + ".xml")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + workdir,
               OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    env.pop("ONEFLOW_TEST_CPU_ONLY", None)
    cmd = [PYTHON, "-c", _LAUNCH, "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
           "-o", "junit_family=xunit1", filename]
    start = time.time()
    try:
        proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True,
                              timeout=timeout)
        out = proc.stdout + proc.stderr
        timed_out = False
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) \
            else (e.stdout or "")
        timed_out = True
    return filename, xml, out, timed_out, time.time() - start


def first_error_line(text):
    """The line that says what went wrong: the last `E   ` line's exception, shortened."""
    lines = [ln[4:].strip() for ln in text.splitlines() if ln.startswith("E   ")]
    candidates = [ln for ln in lines if re.match(r"[\w.]+(Error|Exception|Exit)\b", ln)]
    line = (candidates[0] if candidates else (lines[0] if lines else text.strip()
                                              .splitlines()[0] if text.strip() else "?"))
    return line


def normalize(line):
    """A failure group: the error with file:line locations, numbers and shapes folded."""
    line = re.sub(r"(/[^\s:]+)+\.py:\d+(:\d+)?(:)?\s*", "", line)
    line = re.sub(r"\bline \d+", "line N", line)
    line = re.sub(r"\(\s*\d+(\s*,\s*\d*)*\s*\)", "(shape)", line)
    line = re.sub(r"\[\s*-?\d+(\s*,\s*-?\d+)*\s*\]", "[..]", line)
    line = re.sub(r"(?<![\w.])-?\d+(\.\d+)?(e[-+]?\d+)?\b", "N", line)
    line = re.sub(r"0x[0-9a-f]+", "0x..", line)
    return line[:200]


# Failures of the test code itself in today's environment, counted as not passing but
# reported apart: NumPy 2 removed `np.reshape(newshape=)`, `np.float`, `np.product` (run
# with `--python` of a venv holding NumPy 1.x to avoid them); Python 3.10 removed
# `collections.Sized`; some tests import modules not installed here.
ENVIRONMENT = [
    ("test code incompatible with NumPy 2",
     re.compile(r"unexpected keyword argument 'newshape'|module 'numpy' has no attribute")),
    ("test code incompatible with Python 3.10+",
     re.compile(r"module 'collections' has no attribute")),
    ("third-party module not installed", re.compile(r"No module named '(?!oneflow)")),
    # the TensorFlow reference itself: its CPU kernels refuse layouts and half types that
    # OneFlow's tests ran on GPU, and Keras 3 refuses arguments Keras 2 took
    ("TensorFlow's CPU kernels refuse the reference computation",
     re.compile(r"Current CPU implementations do not|only supports NHWC|"
                r"CPU implementation of Conv3D currently only|expected to be a float tensor "
                r"but is a half tensor")),
    ("test code incompatible with TensorFlow 2.21 (Keras 3)",
     re.compile(r"Argument `learning_rate` should be float")),
]


def environment_kind(line):
    """The ENVIRONMENT label of a failure group's line, or None."""
    return next((label for label, pattern in ENVIRONMENT if pattern.search(line)), None)


def parse_junit(xml):
    tree = ET.parse(xml)
    for case in tree.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name')}"
        failure = case.find("failure")
        error = case.find("error")
        skipped = case.find("skipped")
        if failure is not None:
            text = (failure.text or "") + "\n" + (failure.get("message") or "")
            yield name, "failed", text
        elif error is not None:
            text = (error.text or "") + "\n" + (error.get("message") or "")
            yield name, "error", text
        elif skipped is not None:
            yield name, "skipped", (skipped.get("message") or "")
        else:
            yield name, "passed", ""


def op_tests(single_client, jobs, timeout, only=None, list_all=False):
    ops_dir = os.path.join(single_client, "test", "ops")
    selected, excluded = select_files(ops_dir)
    if only:
        selected = [f for f in selected if f[:-3] in only or f in only]
    workdir = tempfile.mkdtemp(prefix="of_optests_")
    for filename in os.listdir(ops_dir):
        if filename.endswith(".py"):
            shutil.copy(os.path.join(ops_dir, filename), workdir)
    os.makedirs(os.path.join(workdir, "_junit"))
    counts = collections.Counter()
    groups = collections.defaultdict(list)
    per_file = {}
    skip_reasons = collections.Counter()
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        futures = [pool.submit(run_file, workdir, f, timeout) for f in selected]
        for future in concurrent.futures.as_completed(futures):
            filename, xml, out, timed_out, seconds = future.result()
            file_counts = collections.Counter()
            if os.path.exists(xml) and not timed_out:
                for name, status, text in parse_junit(xml):
                    if status == "skipped":
                        if "only runs when node_size" in text:
                            status = "skipped-multi-device"
                        elif "only test cpu cases" in text:
                            status = "skipped-by-oneflow"
                        else:
                            status = "skipped-by-oneflow"
                        skip_reasons[text[:80]] += 1
                    file_counts[status] += 1
                    if status in ("failed", "error"):
                        line = first_error_line(text)
                        if "No module named" in line and "oneflow" not in line:
                            status = "needs-module"
                        groups[normalize(line)].append(f"{filename}::{name.split('::')[-1]}")
            else:
                with open(os.path.join(ops_dir, filename)) as f:
                    n = count_tests(f.read())
                file_counts["timeout" if timed_out else "error"] += n
                line = (f"file timed out after {timeout} s" if timed_out
                        else first_error_line(out))
                groups[normalize(line)].extend([f"{filename}"] * n)
            counts.update(file_counts)
            per_file[filename] = (file_counts, seconds)
            print(f"  {filename:55s} {seconds:6.1f}s  " +
                  " ".join(f"{k}={v}" for k, v in sorted(file_counts.items())), flush=True)
    shutil.rmtree(workdir, ignore_errors=True)

    ran = counts["passed"] + counts["failed"] + counts["error"] + counts["timeout"]
    by_rule = sum(n for files in excluded.values() for _, n in files)
    print(f"\n== OneFlow's legacy op tests ({ops_dir})")
    versions = subprocess.run(
        [PYTHON, "-c", "import sys, numpy; print(sys.version.split()[0], numpy.__version__)"],
        capture_output=True, text=True).stdout.split()
    print(f"interpreter {PYTHON}: Python {versions[0]}, NumPy {versions[1]}" if versions
          else f"interpreter {PYTHON}")
    print(f"files run {len(selected)}; excluded by rule: " +
          ", ".join(f"{rule} {len(files)} files/{sum(n for _, n in files)} tests"
                    for rule, files in excluded.items()))
    print(f"test functions: run {ran}  passed {counts['passed']}  failed {counts['failed']}  "
          f"errors {counts['error']}  timed out {counts['timeout']}  "
          f"skipped-by-rule {by_rule + counts['skipped-multi-device']} "
          f"(files {by_rule}, flow.unittest multi-device {counts['skipped-multi-device']})  "
          f"skipped by OneFlow's own skipIf {counts['skipped-by-oneflow']}")
    if ran:
        print(f"pass rate {100.0 * counts['passed'] / ran:.1f}% of the {ran} run")
    environment = collections.Counter()
    for line, tests in groups.items():
        kind = environment_kind(line)
        if kind:
            environment[kind] += len(tests)
    if environment:
        print("of the failures, environment (the test code fails before onnxjob runs): " +
              ", ".join(f"{kind} {n}" for kind, n in environment.most_common()))
    print("failure groups (first error line), most frequent first:")
    for line, tests in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        examples = ", ".join(sorted(set(tests)) if list_all else sorted(set(tests))[:3])
        kind = environment_kind(line)
        tag = f"[environment: {kind}] " if kind else ""
        print(f"  {len(tests):4d}  {tag}{line}\n        e.g. {examples}")
    for rule, files in excluded.items():
        print(f"excluded ({rule}): " + ", ".join(f for f, _ in files))
    return counts, groups


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--oneflow", required=True,
                        help="OneFlow's python/oneflow/compatible/single_client folder")
    parser.add_argument("--names", action="store_true")
    parser.add_argument("--op-tests", action="store_true")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=int, default=120, help="seconds per test file")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter for the op tests (e.g. a venv with NumPy 1.x, "
                             "onnxjob's dependencies and tensorflow-cpu, as OneFlow 0.5's "
                             "tests expect); onnxjob comes from this checkout")
    parser.add_argument("--only", default="", help="comma-separated test files (op tests)")
    parser.add_argument("--list", action="store_true",
                        help="name every test of each failure group, not three")
    args = parser.parse_args()
    if not (args.names or args.op_tests):
        args.names = args.op_tests = True
    if args.names:
        check_names(args.oneflow)
    if args.op_tests:
        only = set(filter(None, args.only.split(",")))
        global PYTHON
        PYTHON = args.python
        op_tests(args.oneflow, args.jobs, args.timeout, only, args.list)


if __name__ == "__main__":
    main()

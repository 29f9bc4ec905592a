"""OneFlow's own API examples, run as a user would run them.

    python bench/oneflow_docstring_examples.py \
        --oneflow /tmp/of05/python/oneflow/compatible/single_client \
        [--timeout 60] [--only concat,image_flip] [--keep DIR]

Every `.. code-block:: python` of a docstring in OneFlow's single_client sources (not its
tests) that defines a job function is written to a file and run with `python -m onnxjob
run` in a work folder that also holds what the image examples read: three JPEGs
`img/{1,2,3}.jpg` and an OFRecord part `imgdataset/part-0` of them ("encoded",
"class/label"). Examples of the optimizers, which use a `lenet` and `BATCH_SIZE` defined
elsewhere in OneFlow's docs, get those they lack and three calls of their job. Prints each failing
example with its last line, then the failures grouped by error. (The image examples import
cv2: pip install opencv-python-headless to run them.) Get the sources with e.g.
`git archive v0.5.0 python/oneflow/compatible | tar -x -C /tmp/of05`.
"""
import argparse
import ast
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_HEADER = "import numpy as np\nimport oneflow.compatible.single_client as flow\n"
_BATCH = "BATCH_SIZE = 8\n"
_LENET = ("def lenet(images, train=False):\n"
          "    return flow.layers.dense(flow.reshape(images, (images.shape[0], -1)), 10, "
          "name='fc')\n\n")
_FOOTER = ("\nfor _ in range(3):\n    print(train_job(np.random.rand(BATCH_SIZE, 1, 28, 28)."
           "astype(np.float32), np.random.randint(0, 10, BATCH_SIZE).astype(np.int32)))\n")


def _completed(code):
    """An optimizer example (its train_job over a `lenet` and `BATCH_SIZE` of OneFlow's
    LeNet page) with what it leaves out, and three calls of the job."""
    if "BATCH_SIZE" not in code or "lenet(" not in code or "def train_job" not in code:
        return code
    header = _HEADER + ("" if "BATCH_SIZE =" in code else _BATCH) + (
        "" if "def lenet" in code else _LENET)
    return header + code + _FOOTER


def examples(single_client):
    """{file name: code} of the docstring code blocks that define a job function."""
    out = {}
    for root, _, files in os.walk(single_client):
        if os.sep + "test" in root[len(single_client):]:
            continue
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(root, name)
            try:
                tree = ast.parse(open(path).read())
            except SyntaxError:
                continue
            module = os.path.relpath(path, single_client)[:-3].replace(os.sep, "_")
            for node in ast.walk(tree):
                if not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    continue
                doc = ast.get_docstring(node, clean=True) or ""
                blocks = re.split(r"\.\. code-block:: python\s*\n", doc)[1:]
                for i, block in enumerate(blocks):
                    code = _indented_block(block)
                    if "global_function" in code and ">>>" not in code:
                        out[f"{module}__{node.name}_{i}.py"] = _completed(code)
    return out


def _indented_block(block):
    lines = []
    for line in block.split("\n"):
        if line.strip() and not line.startswith("    "):
            break
        lines.append(line)
    return textwrap.dedent("\n".join(lines)).strip() + "\n"


def write_fixtures(workdir):
    """The images and the OFRecord part the image examples read (needs cv2; without it
    those examples fail on their own `import cv2`)."""
    try:
        import cv2
    except ImportError:
        return
    sys.path.insert(0, ROOT)
    from onnxjob.io import ofrecord
    rng = np.random.default_rng(0)
    os.makedirs(os.path.join(workdir, "img"))
    records = []
    for i, (h, w) in enumerate([(349, 367), (300, 280), (256, 320)], 1):
        pixels = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
        cv2.imwrite(os.path.join(workdir, "img", f"{i}.jpg"), pixels)
        records.append({"encoded": cv2.imencode(".jpg", pixels)[1].tobytes(),
                        "class/label": np.int32(i)})
    [part] = ofrecord.write_dataset(os.path.join(workdir, "imgdataset"), records * 3, 1)
    os.rename(part, os.path.join(workdir, "imgdataset", "part-0"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--oneflow", required=True, help="OneFlow's single_client folder")
    parser.add_argument("--timeout", type=int, default=60)
    parser.add_argument("--only", default="", help="comma-separated parts of example names")
    parser.add_argument("--keep", default=None, help="run in this folder and keep it")
    args = parser.parse_args()
    found = examples(os.path.abspath(args.oneflow))
    if args.only:
        wanted = args.only.split(",")
        found = {n: c for n, c in found.items() if any(w in n for w in wanted)}
    workdir = args.keep or tempfile.mkdtemp(prefix="of_docstring_examples_")
    os.makedirs(workdir, exist_ok=True)
    write_fixtures(workdir)
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    failures = collections.defaultdict(list)
    passed = 0
    for name, code in sorted(found.items()):
        with open(os.path.join(workdir, name), "w") as f:
            f.write(code)
        try:
            done = subprocess.run([sys.executable, "-m", "onnxjob", "run", name], cwd=workdir,
                                  env=env, capture_output=True, text=True, timeout=args.timeout)
            lines = [ln for ln in (done.stdout + done.stderr).splitlines()
                     if ln.strip() and "Warning" not in ln]
            ok, last = done.returncode == 0, (lines[-1] if lines else "")
        except subprocess.TimeoutExpired:
            ok, last = False, f"timed out after {args.timeout} s"
        if ok:
            passed += 1
            continue
        print(f"  {name}: {last[:200]}")
        failures[re.sub(r"\S+\.py:\d+: ", "", last)[:80]].append(name)
    print(f"\n== OneFlow's docstring examples ({args.oneflow}): {passed} of {len(found)} run "
          "to their end")
    for line, names in sorted(failures.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(names):3d}  {line}\n       e.g. {', '.join(names[:3])}")
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()

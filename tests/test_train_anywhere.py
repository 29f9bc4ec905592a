"""A train job exported as a train step (onnxjob/io/export.py): its metadata, a step run by
plain onnxruntime without onnxjob, and examples/node: one MNIST epoch trained from
JavaScript with onnxruntime-node, step for step equal to the Python job."""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import onnxjob as flow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NODE_EXAMPLE = os.path.join(ROOT, "examples", "node")
sys.path.insert(0, NODE_EXAMPLE)
import prepare  # noqa: E402  (examples/node/prepare.py: the example's jobs)


def metadata(path):
    model = onnx.load(path)
    spec = json.loads({p.key: p.value for p in model.metadata_props}["onnxjob.train_step"])
    return model, spec


def batches(images, labels, count):
    return [(prepare.pixels(images[i * prepare.BATCH:(i + 1) * prepare.BATCH]),
             labels[i * prepare.BATCH:(i + 1) * prepare.BATCH].astype(np.int32))
            for i in range(count)]


def synthetic_digits(count, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 256, (count, 784), dtype=np.uint8),
            rng.integers(0, 10, count).astype(np.uint8))


def test_train_step_metadata_pairs_every_state_input_with_its_next_output(tmp_path):
    flow.config.seed(0)
    train_step, _ = prepare.define_jobs()
    model, spec = metadata(flow.export(train_step, str(tmp_path / "step.onnx")))
    inputs = {i.name for i in model.graph.input}
    outputs = {o.name for o in model.graph.output}
    initializers = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert spec["format"] == "onnxjob.train_step" and spec["version"] == 1
    assert [(f["name"], f["shape"], f["dtype"]) for f in spec["feeds"]] == \
        [("images", [100, 784], "float32"), ("labels", [100], "int32")]
    assert spec["outputs"] == [{"name": "output_0", "shape": [], "dtype": "float32"}]
    variables = {k: v.numpy() for k, v in flow.get_all_variables().items()}
    assert {s["variable"] for s in spec["state"]} == set(variables)   # weights, momenta, step
    for s in spec["state"]:
        assert s["input"] in inputs and s["output"] in outputs
        np.testing.assert_array_equal(initializers[s["initial"]], variables[s["variable"]])
        assert list(initializers[s["initial"]].shape) == s["shape"]
    assert inputs == {f["name"] for f in spec["feeds"]} | {s["input"] for s in spec["state"]}


def test_exported_step_trains_in_plain_onnxruntime_without_onnxjob(tmp_path):
    """The step file alone, in a process that never imports onnxjob, gives the job's losses."""
    flow.config.seed(0)
    train_step, _ = prepare.define_jobs()
    path = flow.export(train_step, str(tmp_path / "step.onnx"))
    images, labels = synthetic_digits(4 * prepare.BATCH)
    np.save(tmp_path / "images.npy", images)
    np.save(tmp_path / "labels.npy", labels)
    expected = [float(train_step(x, y)) for x, y in batches(images, labels, 4)]
    script = tmp_path / "plain.py"
    script.write_text(textwrap.dedent(f"""
        import json, sys
        import numpy as np, onnx, onnxruntime as ort
        from onnx import numpy_helper
        model = onnx.load({path!r})
        spec = json.loads({{p.key: p.value for p in model.metadata_props}}["onnxjob.train_step"])
        initial = {{t.name: numpy_helper.to_array(t) for t in model.graph.initializer}}
        state = {{s["input"]: initial[s["initial"]] for s in spec["state"]}}
        options = ort.SessionOptions()
        options.log_severity_level = 3
        session = ort.InferenceSession({path!r}, options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        images, labels = np.load({str(tmp_path / "images.npy")!r}), np.load({str(tmp_path / "labels.npy")!r})
        losses = []
        for step in range(4):
            x = (images[step * 100:(step + 1) * 100] / 255.0).astype(np.float32)
            y = labels[step * 100:(step + 1) * 100].astype(np.int32)
            result = dict(zip(names, session.run(None, {{**state, "images": x, "labels": y}})))
            losses.append(float(result[spec["outputs"][0]["name"]]))
            state = {{s["input"]: result[s["output"]] for s in spec["state"]}}
        assert "onnxjob" not in sys.modules
        print(json.dumps(losses))
    """))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         cwd=str(tmp_path), env={**os.environ, "PYTHONPATH": ""})
    assert run.returncode == 0, run.stderr
    np.testing.assert_allclose(json.loads(run.stdout), expected, rtol=1e-5)
    assert np.isfinite(expected).all()


def _node_ready():
    """Why the node example cannot run here, or None (installs its npm packages once)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        return "node and npm are not installed"
    if not os.path.isdir(os.path.join(NODE_EXAMPLE, "node_modules", "onnxruntime-node")):
        install = subprocess.run(["npm", "install", "--no-audit", "--no-fund"], cwd=NODE_EXAMPLE,
                                 capture_output=True, text=True, timeout=600)
        assert install.returncode == 0, f"npm install failed:\n{install.stdout}\n{install.stderr}"
    return None


def test_node_trains_one_mnist_epoch_as_the_python_job_does(tmp_path, mnist_path, monkeypatch):
    reason = _node_ready()
    if reason:
        pytest.skip(reason)
    build = tmp_path / "build"
    subprocess.run([sys.executable, os.path.join(NODE_EXAMPLE, "prepare.py"), "--out", str(build),
                    "--mnist", mnist_path], check=True, capture_output=True)
    node = subprocess.run(["node", os.path.join(NODE_EXAMPLE, "train.js"), str(build),
                           str(tmp_path / "trained")], capture_output=True, text=True)
    assert node.returncode == 0, node.stderr
    js_losses = [json.loads(line)["loss"] for line in node.stdout.splitlines()]
    assert len(js_losses) == 600

    # the same job in Python, one thread like the JavaScript session, from the exported values
    monkeypatch.setenv("ONNXJOB_NUM_THREADS", "1")
    train_step, predict = prepare.define_jobs()
    flow.load_variables(flow.checkpoint.get(str(build / "initial")))
    with np.load(mnist_path) as data:
        train = batches(data["x_train"], data["y_train"], 600)
        test_x, test_y = prepare.pixels(data["x_test"]), data["y_test"]
    py_losses = [float(train_step(x, y)) for x, y in train]
    np.testing.assert_allclose(js_losses, py_losses, rtol=1e-5, atol=1e-6)
    assert np.mean(js_losses[-50:]) < 0.3 < js_losses[0]

    py_accuracy = float((predict(test_x).argmax(1) == test_y).mean())
    flow.load_variables(flow.checkpoint.get(str(tmp_path / "trained")))
    js_accuracy = float((predict(test_x).argmax(1) == test_y).mean())
    assert js_accuracy == py_accuracy > 0.95, (js_accuracy, py_accuracy)

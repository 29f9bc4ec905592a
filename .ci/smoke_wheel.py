"""Smoke test of an installed onnxjob wheel with no extras (.ci/run runs it in a fresh venv,
from an empty folder, so `import onnxjob` finds the wheel and not the checkout).

    python /path/to/checkout/.ci/smoke_wheel.py

The quickstart trains 20 steps on the MNIST subset the wheel carries and exports its predict
job; plain onnxruntime runs the file; a checkpoint is saved and loaded back.
"""
import os
import runpy
import subprocess
import sys
import time

import numpy as np

START = time.time()
EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
HEAVY = ("PIL", "torch", "matplotlib")


def no_heavy_imports(when):
    loaded = [name for name in HEAVY if name in sys.modules]
    assert not loaded, f"{when}: {loaded} imported"


import onnxjob as flow  # noqa: E402

assert os.path.join("site-packages", "onnxjob") in flow.__file__, flow.__file__
no_heavy_imports("import onnxjob")

done = subprocess.run([sys.executable, "-m", "onnxjob", "--help"], capture_output=True, text=True)
assert done.returncode == 0 and "export" in done.stdout, done.stderr
# the console script the wheel installs beside the interpreter
command = os.path.join(os.path.dirname(sys.executable), "onnxjob")
done = subprocess.run([command, "settings"], capture_output=True, text=True)
assert done.returncode == 0 and "ONNXJOB_" in done.stdout, done.stderr
# the stand-in packages the child processes of `python -m onnxjob run` import
from onnxjob.compat.oneflow_alias import IMPORT_ROOT  # noqa: E402
for package in ("oneflow", "oneflow_api", "oneflow_onnx"):
    assert os.path.isfile(os.path.join(IMPORT_ROOT, package, "__init__.py")), package
# a script written for OneFlow (and NumPy 1.x) through the installed runner
with open("old_script.py", "w") as f:
    f.write("import numpy as np\nimport oneflow as flow\nimport oneflow.typing as tp\n"
            "@flow.global_function()\n"
            "def double(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:\n    return x * 2\n"
            "print('doubled', double(np.ones(2, dtype=np.float).astype(np.float32)).tolist())\n")
done = subprocess.run([sys.executable, "-m", "onnxjob", "run", "old_script.py"],
                      capture_output=True, text=True)
assert done.returncode == 0 and "doubled [2.0, 2.0]" in done.stdout, done.stderr

sys.argv = ["quickstart.py", "--data", "subset", "--steps", "20", "--output", "mlp_mnist.onnx"]
sys.path.insert(0, EXAMPLES)
quickstart = runpy.run_path(os.path.join(EXAMPLES, "quickstart.py"), run_name="__main__")
predict_job, train_job = quickstart["predict_job"], quickstart["train_job"]

import onnxruntime as ort  # noqa: E402

(train_images, train_labels), (test_images, test_labels) = flow.data.load_mnist_subset(100, 100)
session = ort.InferenceSession("mlp_mnist.onnx", providers=["CPUExecutionProvider"])
probs = session.run(None, {session.get_inputs()[0].name: test_images[0]})[0]
assert probs.shape == (100, 10) and np.allclose(probs.sum(1), 1, atol=1e-5)
assert np.allclose(probs, predict_job(test_images[0]), atol=1e-5)
accuracy = np.mean(probs.argmax(1) == test_labels[0])
assert accuracy > 0.5, accuracy
print(f"plain onnxruntime on mlp_mnist.onnx: {accuracy:.0%} of a test batch right")

flow.checkpoint.save("smoke_checkpoint")
saved = predict_job(test_images[0])
for images, labels in zip(train_images[:5], train_labels[:5]):
    train_job(images, labels)(lambda loss: None)
flow.sync_default_session()
assert not np.allclose(predict_job(test_images[0]), saved)
flow.load_variables(flow.checkpoint.get("smoke_checkpoint"))
# to float rounding: `saved` may come from the frozen predict session (runtime/frozen.py)
assert np.allclose(predict_job(test_images[0]), saved, rtol=1e-5, atol=1e-6)
print("checkpoint saved and loaded back")

no_heavy_imports("the smoke test")
print(f"wheel smoke test passed in {time.time() - START:.1f} s")

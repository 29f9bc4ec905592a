#!/usr/bin/env bash
# The suite against the lowest versions pyproject.toml admits (CI runs the newest).
#
#     bash bench/dependency_floors.sh [PYTHON]      # default: python3.10, the lowest Python
#
# Builds a fresh venv in ${FLOORS_VENV:-/tmp/onnxjob-floors} with each runtime dependency
# pinned to its `>=` floor (onnx, onnx-ir, onnxruntime, numpy) and the test extras less
# PyTorch (no wheel of it for every Python), then runs the tests with this checkout on
# PYTHONPATH. Tests that compare with PyTorch skip or are left out (test_qat imports it).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-python3.10}
venv=${FLOORS_VENV:-/tmp/onnxjob-floors}
floors=$("$python" - <<'EOF'
import re
text = open("pyproject.toml").read()
deps = re.search(r"^dependencies = \[(.*?)\]", text, re.S | re.M).group(1)
print(" ".join(re.sub(r">=", "==", d) for d in re.findall(r'"([^"]+>=[^"]+)"', deps)))
EOF
)
rm -rf "$venv"
"$python" -m venv "$venv"
"$venv/bin/pip" install -q $floors pytest tqdm matplotlib pillow imageio scikit-learn hypothesis
"$venv/bin/pip" list 2>/dev/null | grep -iE "^(onnx|onnx-ir|onnxruntime|numpy) "
PYTHONPATH="$PWD" "$venv/bin/python" -m pytest -q -p no:cacheprovider --ignore=tests/test_qat.py tests

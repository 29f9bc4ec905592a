#!/usr/bin/env bash
# Here (the development machine), once: onnxruntime-gpu for the GPU machine's Python 3.12 in
# 4 pieces of at most 52 MB under .gpuwhl/dpart.*/ (ignored by git), each small enough to
# travel with the checkout in one device call. The TensorRT provider library is left out
# (TensorRT itself is not on that machine) and the rest is xz-compressed: 4 calls instead
# of the 5 that the plain wheel's pieces need (../shared/tools/ort-gpu-on-device.md).
#   bash bench/gpu/pack_onnxruntime_gpu.sh [VERSION]      (default 1.31.1)
set -euo pipefail
version=${1:-1.31.1}
cd "$(dirname "$0")/../.."
grep -qx '/.gpuwhl/' .git/info/exclude 2>/dev/null || echo /.gpuwhl/ >> .git/info/exclude
work=$(mktemp -d)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 -d "$work" "onnxruntime-gpu==$version"
(cd "$work" && unzip -q onnxruntime_gpu-*.whl && rm onnxruntime_gpu-*.whl \
  && rm -f onnxruntime/capi/libonnxruntime_providers_tensorrt.so \
  && tar -cf - onnxruntime onnxruntime_gpu-*.dist-info | xz -T0 -6 > ort.tar.xz)
rm -rf .gpuwhl && mkdir -p .gpuwhl
(cd .gpuwhl && split -b 52m "$work/ort.tar.xz" part. && for p in part.*; do mkdir "d$p" && mv "$p" "d$p/"; done)
rm -rf "$work"
ls .gpuwhl

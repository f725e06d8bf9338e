#!/usr/bin/env bash
# Fill the wheelhouse that tests/special_gpu/run_all.sh installs on a GPU machine without a package registry.
#
# Run it here (a machine with PyPI) before the GPU call, then carry tests/special_gpu/wheels with the call. It
# fetches only what the GPU checks import and the GPU image lacks: megatron-core, tensordict (+ pyvers), omegaconf
# (+ antlr4, built here: it has no wheel on PyPI). torch, transformers, numpy, safetensors and pytest come from
# the machine itself and are never replaced.
#
# Usage: bash tests/special_gpu/fetch_wheels.sh      (GPU_PYTHON_VERSION=3.12 by default: the GPU image's Python)
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
GPU_PYTHON_VERSION=${GPU_PYTHON_VERSION:-3.12}
OUT=wheels
mkdir -p "$OUT"
platforms=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
  manylinux2014_x86_64 manylinux1_x86_64 any; do
  platforms+=(--platform "$tag")
done
# the versions CI tests on (pyproject.toml's extras resolve to these on Python 3.11)
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version "$GPU_PYTHON_VERSION" \
  --implementation cp "${platforms[@]}" -d "$OUT" \
  megatron-core==0.16.1 tensordict==0.15.3 pyvers==0.2.3 omegaconf==2.3.1
"$PYTHON" -m pip wheel -q --no-deps -w "$OUT" antlr4-python3-runtime==4.9.3
ls -la "$OUT"
echo "wheelhouse ready: $(du -sh "$OUT" | cut -f1) in tests/special_gpu/$OUT (carry it with the GPU call)"

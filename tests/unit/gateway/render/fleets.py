"""Fleets the render tests deploy: the annotated example, and one with every feature the
renderer handles (P/D pairs of both engines, API keys, parallel GPUs, names to make DNS-safe,
engine arguments with shell and Kubernetes metacharacters, tokenizers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from config.fleet import Fleet, load_fleet, parse_fleet
from gateway.render.assets import Assets, find_assets

ROOT = Path(__file__).resolve().parents[4]
FACTS = {"params": 8e9, "layers": 32, "hidden_size": 4096, "kv_heads": 8, "head_dim": 128,
         "dtype_bytes": 2}
HARDWARE = {"name": "H100", "peak_flops": 9.89e14, "mem_bandwidth": 3.35e12}
SECRETS = {"VLLM_KEY": "vk-test", "SGL_KEY": "sk-test"}


def assets() -> Assets:
    return find_assets(ROOT)


def example_fleet() -> Fleet:
    return load_fleet(ROOT / "deploy" / "fleet.example.yaml")


def _pool(name: str, engine: str, urls: list[str], **more: Any) -> dict[str, Any]:
    return {"name": name, "engine": engine, "models": ["org/llama"], "endpoints": urls,
            "model": FACTS, "hardware": HARDWARE, **more}


def rich_raw() -> dict[str, Any]:
    return {"pools": [
        _pool("General_Pool.v2", "vllm", ["http://a:8000", "http://b:8000"],
              levers={"prefix_caching": True, "chunked_prefill": {"token_budget": 1024}},
              engine_args=["--tensor-parallel-size", "2", "--tool-call-parser", "hermes",
                           "--chat-template", "$(HOME)/t.jinja ${X}"],
              api_key_env="VLLM_KEY", checkpoint="/models/llama"),
        _pool("sgl-prefill", "sglang", ["http://c:30000"], role="prefill", pair="sgl-decode",
              api_key_env="SGL_KEY", engine_args=["--tp-size", "4"]),
        _pool("sgl-decode", "sglang", ["http://d:30000", "http://e:30000"], role="decode",
              api_key_env="SGL_KEY",
              levers={"speculative": {"method": "eagle3", "num_draft_tokens": 3,
                                      "draft_model": "org/eagle3"}}),
        _pool("vllm-prefill", "vllm", ["http://f:8000"], role="prefill", pair="vllm-decode"),
        _pool("vllm-decode", "vllm", ["http://g:8000"], role="decode",
              levers={"speculative": {"method": "ngram", "num_draft_tokens": 4}}),
    ], "routing": {"features": {"tokenizers": {"org/llama": "/opt/tokenizer.json"}}},
        "slos": {"org/llama": {"ttft_s": 1.0}}}  # fmt: skip


def rich_fleet() -> Fleet:
    return parse_fleet(rich_raw(), source="rich fleet")


FLEETS = {"example": example_fleet, "rich": rich_fleet}

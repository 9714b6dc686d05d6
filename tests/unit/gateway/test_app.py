"""Building the app's parts from the fleet file: the feature extractor (tokenizers) and the
router (named plugin instances)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from backends.fleet_file import FleetConfigError, load_fleet, parse_fleet
from gateway.app import build_extractor, build_router
from routing.features import RequestInfo
from tests.fakes.harness import HARDWARE, MODEL_FACTS

tokenizers = pytest.importorskip("tokenizers")


def fleet_raw(routing: dict[str, Any]) -> dict[str, Any]:
    return {"pools": [{"name": "p", "engine": "vllm", "models": ["m", "n"],
                       "endpoints": ["http://h:1", "http://h:2"], "model": MODEL_FACTS,
                       "hardware": HARDWARE}], "routing": routing}


def write_tokenizer(path: Path) -> Path:
    """A word-level tokenizer: one token per whitespace-separated word."""
    words = ["hello", "world", "[UNK]"]
    model = tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]")
    tok = tokenizers.Tokenizer(model)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def test_a_models_tokenizer_counts_its_prompts(tmp_path: Path) -> None:
    write_tokenizer(tmp_path / "tok" / "tokenizer.json")
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(
        "pools:\n"
        "  - {name: p, engine: vllm, models: [m, n], endpoints: ['http://h:1'],\n"
        "     model: {params: 1e9, layers: 2, hidden_size: 8, kv_heads: 1, head_dim: 8,\n"
        "             dtype_bytes: 2},\n"
        "     hardware: {peak_flops: 1e12, mem_bandwidth: 1e11}}\n"
        "routing:\n"
        "  features: {block_tokens: 8, tokenizers: {m: tok/tokenizer.json}}\n")
    extractor = build_extractor(load_fleet(fleet_file))  # relative to the fleet file
    prompt = {"prompt": "hello world hello nonsense words here"}
    exact = extractor.extract(prompt, RequestInfo("completions", "m"))
    estimated = extractor.extract(prompt, RequestInfo("completions", "n"))
    assert exact.prompt_tokens == 6  # one per word
    assert estimated.prompt_tokens == 10  # no tokenizer for n: ⌈37 characters / 4⌉
    assert extractor.config.block_tokens == 8


def test_an_unloadable_tokenizer_stops_start_up_naming_the_field(tmp_path: Path) -> None:
    fleet = parse_fleet(fleet_raw({"features": {"tokenizers": {"m": str(tmp_path / "no.json")}}}))
    with pytest.raises(FleetConfigError, match=r"routing.features.tokenizers.m: cannot load "):
        build_extractor(fleet)


def test_named_plugin_instances_reach_every_pools_scheduler() -> None:
    fleet = parse_fleet(fleet_raw({
        "plugins": [{"name": "roomy", "type": "not_saturated", "parameters": {"max_waiting": 2}}],
        "scheduler": {"filters": ["healthy", "roomy"]}}))
    scheduler = build_router(fleet).schedulers["p"]
    assert scheduler.plugin_names == ("healthy", "roomy", "cache_aware", "max_score")

"""The whole fleet file: loading it, and the checks across its sections."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from config.fleet import FleetConfigError, expand_variables, load_fleet, parse_fleet
from tests.unit.config.fleets import FACTS, pool

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("name", ["deploy/fleet.example.yaml", "gateway/demo/demo-fleet.yaml",
                                  "gateway/demo/demo-real-fleet.yaml"])
def test_shipped_fleet_files_load(name: str) -> None:
    path = ROOT / name
    if not path.exists():
        pytest.fail(f"{path} is missing")
    fleet = load_fleet(path)
    assert fleet.pools


@pytest.mark.parametrize(
    ("raw", "field", "problem"),
    [
        ({"pools": [pool(engine="tgi")]}, "pools.0.engine", "'vllm' or 'sglang'"),
        ({"pools": [pool(endpoints=[])]}, "pools.0.endpoints", "at least 1"),
        ({"pools": [pool(endpoints=["not a url"])]}, "pools.0.endpoints.0", "URL"),
        ({"pools": [pool(model={**FACTS, "layers": 0})]}, "pools.0.model.layers", "greater than 0"),
        ({"pools": [pool(hardware={"peak_flops": 1})]}, "pools.0.hardware.mem_bandwidth",
         "Field required"),
        ({"pools": [pool(levers={"speculative": {"num_draft_tokens": -1}})]},
         "pools.0.levers.speculative.num_draft_tokens", "greater than 0"),
        ({"pools": [pool(colour="red")]}, "pools.0.colour", "Extra inputs are not permitted"),
        ({"pools": [pool(), pool()]}, "(top level)", "pool names must be unique"),
        ({"pools": [pool(), pool(name="q")]}, "(top level)", "an endpoint belongs to one pool"),
        ({"pools": [pool(role="prefill")]}, "(top level)", "needs 'pair'"),
        ({"pools": [pool(role="prefill", pair="p2"), pool(name="p2", endpoints=["http://h:2"])]},
         "(top level)", "is not a decode pool"),
        ({"pools": []}, "pools", "at least 1"),
        ({"pools": [pool(levers={"speculative": {"method": "ngram"}},
                         simulator={"acceptance_rate": 0.7})]},
         "pools.0", "simulator.acceptance_rate: an n-gram pool's acceptance is computed"),
        ({"pools": [pool(simulator={"acceptance_by_position": [0.8, 1.2]})]},
         "pools.0.simulator.acceptance_by_position.1", "less than 1"),
    ],
)
def test_bad_fleets_name_the_field_and_problem(raw: dict[str, Any], field: str,
                                                problem: str) -> None:
    with pytest.raises(FleetConfigError) as info:
        parse_fleet(raw, source="fleet.yaml")
    message = str(info.value)
    assert message.startswith("fleet.yaml: ")
    assert f"{field}: " in message and problem in message, message


def test_unreadable_and_malformed_files_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(FleetConfigError, match="missing.yaml: cannot read"):
        load_fleet(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools: [\n")
    with pytest.raises(FleetConfigError, match="bad.yaml: not valid YAML"):
        load_fleet(bad)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"pools:\n  - name: caf\xe9\n")
    with pytest.raises(FleetConfigError, match=r"latin.yaml: not UTF-8 text \(byte 0xe9 at "
                                               r"offset 20\)"):
        load_fleet(latin)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(FleetConfigError, match="scalar.yaml: expected a mapping"):
        load_fleet(scalar)


def test_a_prefill_pool_and_its_decode_pool_share_one_kv_cache_dtype() -> None:
    def pair(prefill: str, decode: str) -> dict[str, Any]:
        return {"pools": [
            pool(name="pre", role="prefill", pair="dec", levers={"kv_cache_dtype": prefill}),
            pool(name="dec", role="decode", endpoints=["http://h:2"],
                 levers={"kv_cache_dtype": decode})]}
    assert parse_fleet(pair("fp8", "fp8")).pools[0].levers.kv_cache_dtype == "fp8"
    with pytest.raises(FleetConfigError, match="share one kv_cache_dtype"):
        parse_fleet(pair("fp8", "auto"))
    with pytest.raises(FleetConfigError, match="share one kv_cache_dtype"):
        parse_fleet(pair("fp8", "fp8_e4m3"))  # vLLM's NIXL hand-off compares the names


def test_slos_may_name_an_adapter() -> None:
    fleet = parse_fleet({"pools": [pool(adapters=["sql-lora"])],
                         "slos": {"sql-lora": {"ttft_s": 1}}})
    assert "sql-lora" in fleet.slos


def test_tokenizer_paths_expand_variables_then_resolve_against_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MODELS_DIR", "/models")
    monkeypatch.delenv("NO_SUCH_DIR", raising=False)
    (tmp_path / "fleet.yaml").write_text(
        "pools:\n"
        "  - {name: p, engine: vllm, models: [a, b, c], endpoints: ['http://h:1']}\n"
        "routing:\n"
        "  features:\n"
        "    tokenizers:\n"
        "      a: ${MODELS_DIR}/a\n"
        "      b: {path: '${NO_SUCH_DIR:-../up}/b', chat_template: t.jinja}\n"
        "      c: $MODELS_DIR/c/tokenizer.json\n")
    got = load_fleet(tmp_path / "fleet.yaml").routing.features.tokenizers
    assert got["a"].path == "/models/a"
    assert got["b"].path == str(tmp_path / "../up/b")
    assert got["b"].chat_template == str(tmp_path / "t.jinja")
    assert got["c"].path == "/models/c/tokenizer.json"


@pytest.mark.parametrize(("path", "env", "expected"), [
    ("$A/x", {"A": "a"}, "a/x"), ("${A}x", {"A": "a"}, "ax"), ("$B/x", {}, "$B/x"),
    ("${B:-d}/x", {}, "d/x"), ("${B:-d}/x", {"B": ""}, "d/x"), ("${B:-d}/x", {"B": "b"}, "b/x"),
    ("plain", {}, "plain"),
])
def test_expand_variables(path: str, env: dict[str, str], expected: str) -> None:
    assert expand_variables(path, env) == expected

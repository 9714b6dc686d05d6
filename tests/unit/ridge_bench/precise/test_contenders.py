"""The routers of the precise-routing run: ridge's fleet file, the vLLM router's ``kv_aware``
flags and its logged decisions (nothing is started)."""

from __future__ import annotations

import itertools
from pathlib import Path

from config.fleet import parse_fleet
from ridge_bench.harness.gateways import Gateway, Launch, command
from ridge_bench.precise.contenders import (
    CONTENDERS,
    decision_outcomes,
    kv_aware_args,
    ridge_fleet,
    router_args,
)
from ridge_bench.precise.engines import demo_pool, engine_pool

LOG = (
    '\x1b[2m2026\x1b[0m DEBUG vllm_router_rs::policies::kv_aware: KV prefix decision '
    '\x1b[3moutcome\x1b[0m\x1b[2m=\x1b[0m"prefix_cost" worker="http://127.0.0.1:1"\n'
    'DEBUG KV prefix decision outcome="missing_tokens" worker="http://127.0.0.1:2"\n'
    'DEBUG KV prefix decision outcome="prefix_cost" worker="http://127.0.0.1:2"\n'
    'DEBUG KV request selected attempt=0\n'
)


def raw_pool() -> dict[str, object]:
    ports = itertools.count(22000)
    return engine_pool(demo_pool(), lambda: next(ports), 24)


def test_ridge_follows_the_events_with_the_models_tokenizer(tmp_path: Path) -> None:
    raw = ridge_fleet(raw_pool(), tmp_path)
    assert raw["routing"]["features"]["tokenizers"] == {
        "smollm2-135m": {"path": str(tmp_path.resolve()), "required": True}}
    pool = parse_fleet(raw).pools[0]
    assert pool.kv_events is not None and len(pool.kv_event_sources()) == 2


def test_kv_aware_subscribes_to_each_engines_stream_and_replay() -> None:
    pool = parse_fleet({"pools": [raw_pool()]}).pools[0]
    assert kv_aware_args(pool) == [
        "--kv-event-source", "http://127.0.0.1:22000=tcp://127.0.0.1:22002",
        "--kv-event-replay-source", "http://127.0.0.1:22000=tcp://127.0.0.1:22004",
        "--kv-event-source", "http://127.0.0.1:22001=tcp://127.0.0.1:22003",
        "--kv-event-replay-source", "http://127.0.0.1:22001=tcp://127.0.0.1:22005",
        "--kv-event-block-size", "128", "--kv-event-model", "smollm2-135m",
        "--log-level", "debug"]
    assert router_args(CONTENDERS["vllm-kv"], pool) == kv_aware_args(pool)
    assert router_args(CONTENDERS["vllm-rr"], pool) == []


def test_the_router_command_ends_with_the_policys_flags(tmp_path: Path) -> None:
    gateway = Gateway("vllm-kv", "kv", "vllm-router", "kv_aware")
    argv, env, _ = command(gateway, Launch(vllm_router_python=Path("py")), 9, ["http://a:1"],
                           tmp_path, ["--kv-event-block-size", "128"])
    assert argv[argv.index("--policy") + 1] == "kv_aware"
    assert argv[-2:] == ["--kv-event-block-size", "128"] and env == {"PYTHONPATH": ""}


def test_decisions_are_counted_by_outcome() -> None:
    assert decision_outcomes(LOG) == {"prefix_cost": 2, "missing_tokens": 1}
    assert decision_outcomes("") == {}


def test_the_open_ridge_differs_only_in_admission_control() -> None:
    plain, open_ = CONTENDERS["ridge"], CONTENDERS["ridge-open"]
    assert (plain.kind, plain.env) == ("ridge", {})
    assert (open_.kind, open_.env) == ("ridge", {"RIDGE_ADMISSION__ENABLED": "false"})

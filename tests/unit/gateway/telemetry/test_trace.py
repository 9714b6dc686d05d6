"""gateway.telemetry.trace: hash ids from router block hashes, rotation and size bounds, the
queue."""

from __future__ import annotations

import json
from pathlib import Path

from prometheus_client import CollectorRegistry

from gateway.request.body import ApiPath, parse_request
from gateway.settings import TraceSettings
from gateway.telemetry.trace import (
    HashIds,
    TraceConfig,
    TraceRecorder,
    TraceWriter,
    build_recorder,
    dropped_counter,
    trace_keys,
    worker_path,
)
from routing.features import FeatureConfig, FeatureExtractor, RequestFeatures, RequestInfo

CHAT = parse_request(ApiPath.CHAT,
                     b'{"model": "m", "messages": [{"role": "user", "content": "x"}]}')
EMBED = parse_request(ApiPath.EMBEDDINGS, b'{"model": "m", "input": "x"}')


def features(text: str, max_tokens: int | None = None) -> RequestFeatures:
    """The router's features of a chat request whose one user message is ``text``."""
    payload = {"model": "m", "messages": [{"role": "user", "content": text}]}
    return FeatureExtractor(FeatureConfig()).extract(
        payload, RequestInfo("chat", "m", max_tokens=max_tokens))


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def write(config: TraceConfig, texts: list[str], output: int = 7) -> None:
    writer = TraceWriter(config)
    writer.write([(features(t), i * 0.5, output) for i, t in enumerate(texts)])
    writer.close()


def test_shared_prefixes_share_leading_ids(tmp_path: Path) -> None:
    base = "".join(f"w{i:05d} " for i in range(900))  # 6,300 characters ≈ 1,575 tokens
    config = TraceConfig(str(tmp_path / "t.jsonl"), block_tokens=128)  # 512 characters
    write(config, [base + "first " * 40, base + "second " * 40, "unrelated " * 300])
    a, b, c = lines(tmp_path / "t.jsonl")
    ids_a, ids_b, ids_c = (list(r["hash_ids"]) for r in (a, b, c))  # type: ignore[call-overload]
    shared = len(base) // 512  # whole trace blocks inside the common text
    assert ids_a[:shared] == ids_b[:shared] == list(range(shared))
    assert ids_a[shared:] != ids_b[shared:]
    assert not set(ids_c) & set(ids_a)
    for r in (a, b, c):  # ⌈input_length / block_tokens⌉ ids, the last for a partial block
        assert len(r["hash_ids"]) == -(-r["input_length"] // 128)  # type: ignore[arg-type,operator]


def test_trace_keys_group_router_blocks_and_key_the_partial_block() -> None:
    hashes = tuple(range(100, 110))  # 10 router blocks of 16 tokens
    keys = trace_keys(hashes, 170, 4, 64)  # 3 trace blocks of 64 tokens, the last partial
    assert keys[:2] == [103, 107] and keys[2] == (2, 109)
    assert trace_keys((), 10, 4, 64)[0] != trace_keys((), 10, 4, 64)[0]  # no hash: its own


def test_ids_are_small_ints_in_first_seen_order() -> None:
    ids = HashIds()
    assert ids.ids([9, 7, 9]) == [0, 1, 0] and ids.ids([5, 7]) == [2, 1] and len(ids) == 3


def test_lines_parse_as_mooncake_records(tmp_path: Path) -> None:
    config = TraceConfig(str(tmp_path / "t.jsonl"))
    write(config, ["hello " * 500, "hello " * 500 + "again"], output=12)
    records = lines(tmp_path / "t.jsonl")
    for r in records:
        assert set(r) == {"timestamp", "input_length", "output_length", "hash_ids"}
        assert isinstance(r["timestamp"], int) and r["output_length"] == 12
        assert all(isinstance(i, int) for i in r["hash_ids"])  # type: ignore[attr-defined]
    assert [r["timestamp"] for r in records] == [0, 500]
    assert records[0]["input_length"] == features("hello " * 500).prompt_tokens


def test_rotation_bounds_size_and_files(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    config = TraceConfig(str(path), max_bytes=300, max_files=3, block_tokens=16)
    write(config, [f"request {i} " * 40 for i in range(30)])
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["t.jsonl", "t.jsonl.1", "t.jsonl.2"]
    for p in tmp_path.iterdir():
        assert 0 < p.stat().st_size <= 300
        first = lines(p)[0]
        assert first["timestamp"] == 0 and first["hash_ids"][0] == 0  # type: ignore[index]


def test_an_earlier_runs_file_is_rotated_away(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("old\n")
    write(TraceConfig(str(path)), ["new request " * 10])
    assert (tmp_path / "t.jsonl.1").read_text() == "old\n" and len(lines(path)) == 1


def test_id_bound_rotates(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    write(TraceConfig(str(path), max_ids=3, block_tokens=16), ["abcd" * 30, "efgh" * 30])
    assert [r["hash_ids"] for r in lines(path)] == [[0, 1]]
    assert [r["hash_ids"] for r in lines(tmp_path / "t.jsonl.1")] == [[0, 1]]


async def test_full_queue_drops_and_counts(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    recorder = TraceRecorder(TraceConfig(str(tmp_path / "t.jsonl"), queue_size=2),
                             dropped_counter(registry))
    f = features("some prompt " * 20, max_tokens=33)
    for i in range(5):
        recorder.offer(CHAT, f, float(i), None)
    recorder.offer(EMBED, f, 9.0, None)  # not a generation request: not recorded at all
    assert registry.get_sample_value("ridge_trace_dropped_total") == 3
    await recorder.stop()
    records = lines(tmp_path / "t.jsonl")
    assert len(records) == 2 and records[0]["output_length"] == 33  # max_tokens, no usage


def test_off_by_default_and_one_file_per_worker(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    assert build_recorder(TraceSettings(), 16, registry) is None
    assert registry.get_sample_value("ridge_trace_dropped_total") == 0  # exposed while off
    on = build_recorder(TraceSettings(path=str(tmp_path / "t.jsonl")), 16, CollectorRegistry(),
                        1)
    assert on is not None and on.config.path == str(tmp_path / "t.w1.jsonl")
    assert worker_path("t.jsonl", None) == "t.jsonl"

"""The overhead doc: tables from a summary, and rewriting only one section's block."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ridge_bench.harness.gateways import BY_KEY, SMG
from ridge_bench.overhead.doc import begin, end, markdown, summary_table, write

CELL = {"cpu_us": 512.4, "rps": 1234.0, "gateway_core_pct": 99.0, "upstream_core_pct": 4.0,
        "machine_busy_cores": 1.5, "p50_ms": 1.0, "p99_ms": 2.0, "ttft_p50_ms": 25.0,
        "ttft_p99_ms": 30.0, "added_ttft_p50_ms": 3.0, "added_ttft_p99_ms": 8.5,
        "delay_p99_ms": 1.2, "errors": 0, "rounds": 3}
DATA: dict[str, Any] = {
    "meta": {"date": "d", "command": "python -m ridge_bench.overhead", "ridge": "abc1234",
             "ridge_from": "the installed ridge", "machine": "2 cores", "software": "Python",
             "targets": {"direct": "direct", "ridge": "ridge, default settings"},
             "plan": {"rounds": 3, "seconds": 4, "paced_seconds": 5, "endpoints": 8,
                      "chunks": 20, "stream_concurrency": 32},
             "notes": ["gateway on core 0"]},
    "summary": {
        "ridge": {s: dict(CELL) for s in ("json32", "json256", "burst32", "paced32")},
        "direct": {s: {**CELL, "cpu_us": None} for s in ("json32", "json256", "paced32")},
    },
}


def test_the_headline_table() -> None:
    lines = summary_table(DATA)
    assert lines[2] == "| ridge, default settings | 512 | 1,234 | 512 / 512 | +3.0 / +8.5 | 0 |"
    assert lines[3].startswith("| direct | – | 1,234 | – / – | (base: 25.0 / 30.0) |")


def test_markdown_names_the_commit_and_notes() -> None:
    text = markdown(DATA)
    assert text.startswith("### ridge at abc1234") and "- gateway on core 0" in text
    assert markdown(DATA, "Before").startswith("### Before")


def test_write_replaces_only_its_section(tmp_path: Path) -> None:
    doc = tmp_path / "overhead.md"
    doc.write_text(f"intro\n{begin('before')}\nold\n{end('before')}\nmiddle\n")
    write(doc, DATA, "before")
    write(doc, DATA, "current")
    text = doc.read_text()
    assert text.startswith("intro\n") and "old" not in text and "\nmiddle\n" in text
    assert text.index(end("before")) < text.index("middle") < text.index(begin("current"))
    write(doc, DATA, "current")
    assert doc.read_text() == text


def test_the_new_routers_rows_carry_their_labels_in_order() -> None:
    keys = ("ridge", "vllm-ca", "smg-rr", "sglang-rr", "vllm-rr", "smg-ca")
    data = {**DATA, "meta": {**DATA["meta"], "targets": {k: BY_KEY[k].label for k in keys}},
            "summary": {k: {s: dict(CELL) for s in ("json32", "json256", "burst32", "paced32")}
                        for k in keys}}
    rows = [line.split(" | ")[0].lstrip("| ") for line in summary_table(data)[2:]]
    assert rows == ["SGLang router 0.3.2, round robin", f"smg {SMG.split('==')[1]}, round robin",
                    f"smg {SMG.split('==')[1]}, cache_aware", "vLLM router 0.1.17, round robin",
                    "vLLM router 0.1.17, cache_aware", "ridge, default settings"]

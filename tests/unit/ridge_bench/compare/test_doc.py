"""The comparison doc: target checks on worked cells, tables, and rewriting between markers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ridge_bench.compare.doc import (
    BEGIN,
    END,
    checks,
    detail_table,
    goodput_table,
    markdown,
    merged,
    portable,
    steps_table,
    write_doc,
)


def cell(workload: str, router: str, goodput: float,
         steps: list[dict[str, float]] | None = None) -> dict[str, Any]:
    summary = {"requests": 10, "ok": 10, "good": 5, "window_s": 10.0, "goodput_rps": goodput,
               "throughput_rps": 1.0, "throughput_tps": 100.0, "attainment": 0.5,
               "errors": {}, "ttft_p50_s": 0.1, "ttft_p99_s": 0.2, "tpot_p50_s": 0.05,
               "tpot_p99_s": 0.09, "e2e_p50_s": 3.0, "e2e_p99_s": 4.0, "pool_share": {}}
    step_summaries = [{**summary, "pool_share": share} for share in (steps or [{}])]
    return {"workload": workload, "router": router, "rates_rps": [1.0] * len(step_summaries),
            "summary": summary, "steps": step_summaries, "f_sent": 0.8, "client_cpu_s": 1.0,
            "engine_prefix_cache": {"hit_rate": 0.7},
            "cpu": {"wall_s": 10.0, "sim": {"cpu_s": 1.0, "core_pct": 10.0},
                    "ridge": {"cpu_s": 2.0, "core_pct": 20.0}}, "saturated": []}


FALLING = [{"spec": 0.4, "radix": 0.6}, {"spec": 0.2, "radix": 0.8}, {"radix": 1.0}]


def test_targets_on_worked_numbers() -> None:
    cells = [cell("agent", "round_robin", 2.0), cell("agent", "ridge", 3.1),
             cell("mixed", "round_robin", 2.0), cell("mixed", "cache_aware", 2.8),
             cell("mixed", "ridge", 2.7, [{"spec": 0.2}] * 3),
             cell("chat", "round_robin", 1.0), cell("chat", "ridge", 0.96),
             cell("chat_ramp", "ridge", 2.0, FALLING)]
    agent, mixed_rr, mixed_ca, chat, spec, mixed_spec = checks(cells)
    assert agent.met and agent.goal == pytest.approx(3.0)
    assert not mixed_rr.met and "short by 10%" in mixed_rr.text()  # 2.7 vs 3.0
    assert not mixed_ca.met and mixed_ca.goal == 2.8
    assert chat.met and chat.goal == pytest.approx(0.95)
    assert spec.met and (spec.value, spec.goal) == (0.0, 0.4)
    assert spec.text() == "chat_ramp: ridge's spec share falls with load: " \
                          "40% → 20% → 0% over the steps — met"
    assert mixed_spec.met is None  # reported only
    assert mixed_spec.text().endswith("spec share: 20% → 20% → 20% over the steps")


def test_every_full_router_row_gets_its_targets() -> None:
    cells = [cell("agent", "round_robin", 2.0), cell("agent", "ridge", 3.1),
             cell("agent", "ridge_sglang", 2.9)]
    assert checks(cells, "ridge_sglang")[0].met is False
    meta = {"command": "x", "requests": 1, "durations_s": {"agent": 1}, "steps": 3,
            "seed": 0, "speed": 1,
            "slo": {"ttft_s": 2, "tpot_s": 0.1, "e2e_s": 30}, "rates": {"agent": 6},
            "cpus": 2, "machine": "x86_64", "python": "3.11"}
    text = markdown(cells, meta)
    assert "### Targets: ridge\n" in text and "### Targets: ridge_sglang\n" in text


def test_a_spec_share_that_rises_at_any_step_misses() -> None:
    rising = [{"spec": 0.2}, {"spec": 0.3}, {"spec": 0.1}]
    *_, spec = checks([cell("chat_ramp", "ridge", 1.0, rising)])
    assert spec.met is False and "MISSED" in spec.text()
    *_, flat = checks([cell("chat_ramp", "ridge", 1.0, [{"spec": 0.2}] * 3)])
    assert flat.met is False


def test_the_steps_table_shows_how_much_chat_the_spec_pool_took() -> None:
    mixed = cell("mixed", "ridge", 1.0, FALLING)
    mixed["step_kind_pools"] = [{"chat": {"spec": 0.9, "radix": 0.1}},
                                {"chat": {"radix": 1.0}}, {"agent": {"radix": 1.0}}]
    rows = steps_table([mixed]).splitlines()[2:]
    assert [r.rsplit("|", 2)[1].strip() for r in rows] == ["90%", "0%", "-"]


def test_targets_without_their_cells_are_not_measured() -> None:
    assert all(c.met is None and "not measured" in c.text() for c in checks([]))


def test_the_goodput_table_shows_ratios_to_round_robin() -> None:
    table = goodput_table([cell("agent", "round_robin", 2.0), cell("agent", "ridge", 3.0)])
    assert "| agent | 2.00 (1.00×) | 3.00 (1.50×) |" in table


def test_write_doc_keeps_the_hand_written_text(tmp_path: Path) -> None:
    doc = tmp_path / "router.md"
    doc.write_text(f"# Title\n\nintro\n\n{BEGIN}\nold\n{END}\n\n## Discussion\nkept\n")
    meta = {"command": "python -m ridge_bench.compare", "requests": 400,
            "durations_s": {"agent": 60}, "steps": 3, "seed": 0, "speed": 1,
            "slo": {"ttft_s": 2, "tpot_s": 0.1, "e2e_s": 30}, "rates": {"agent": 6},
            "cpus": 2, "machine": "x86_64", "python": "3.11"}
    write_doc(doc, markdown([cell("agent", "round_robin", 2.0)], meta))
    text = doc.read_text()
    assert text.startswith("# Title\n\nintro\n\n" + BEGIN) and "old" not in text
    assert text.endswith(f"{END}\n\n## Discussion\nkept\n")
    assert "TPOT ≤ 100 ms" in text


def test_the_printed_command_names_no_local_paths() -> None:
    cmd = "python -m ridge_bench.compare --rate agent=16 --out /tmp/x --doc=/tmp/d.md --seed 1"
    assert portable(cmd) == "python -m ridge_bench.compare --rate agent=16 --seed 1"


def test_write_doc_appends_the_block_to_a_doc_without_markers(tmp_path: Path) -> None:
    doc = tmp_path / "new.md"
    write_doc(doc, "table")
    assert doc.read_text() == f"{BEGIN}\ntable\n{END}\n"


def test_the_detail_table_shows_the_gateways_cpu_and_memory_when_measured() -> None:
    old = cell("chat", "cache_aware", 1.0)  # a results.json without the memory figures
    ridge = {**cell("chat", "cache_aware", 1.0), "gateway_peak_rss_mb": 120.4,
             "ridge_prefix_index_bytes": 2**20, "ridge_kv_event_index_bytes": 2**19}
    sglang = {**cell("chat", "sglang_ca", 1.0), "gateway_peak_rss_mb": 30.0,
              "cpu": {"wall_s": 10.0, "sim": {"cpu_s": 1.0, "core_pct": 10.0},
                      "sglang": {"cpu_s": 3.0, "core_pct": 30.0}}}
    rows = [r.split(" | ")[-3:-1] for r in detail_table([old, ridge, sglang]).splitlines()[2:]]
    assert rows == [["10/20/10", "-"], ["10/20/10", "120 (index 1.5 MB)"], ["10/30/10", "30"]]
    small = {**ridge, "ridge_prefix_index_bytes": 10000, "ridge_kv_event_index_bytes": None}
    assert "| 120 (index 10 kB) |" in detail_table([small])


def test_the_printed_command_keeps_the_tokenizer_by_its_folder_name() -> None:
    cmd = "python -m ridge_bench.compare --tokenizer /a/b/smollm2-135m --kv-events --out /x"
    assert portable(cmd) == "python -m ridge_bench.compare --tokenizer smollm2-135m --kv-events"
    assert portable("python -m ridge_bench.compare --tokenizer=/a/smol") == \
        "python -m ridge_bench.compare --tokenizer=smol"


def test_the_settings_say_how_prompt_tokens_were_counted_and_whether_events_were_on() -> None:
    meta = {"command": "x", "requests": 1, "durations_s": {"agent": 1}, "steps": 3,
            "seed": 0, "speed": 1, "slo": {"ttft_s": 2, "tpot_s": 0.1, "e2e_s": 30},
            "rates": {"agent": 6}, "cpus": 2, "machine": "x86_64", "python": "3.11"}
    cells = [cell("agent", "ridge", 1.0)]
    assert "KV-cache events" not in markdown(cells, meta)  # results saved before the switches
    on = markdown(cells, {**meta, "tokenizer": "smollm2-135m", "kv_events": True})
    assert "Prompt tokens: the smollm2-135m tokenizer; KV-cache events: on." in on
    off = markdown(cells, {**meta, "tokenizer": None, "kv_events": False})
    assert "KV-cache events: off." in off


def run_meta(command: str, **rates: float) -> dict[str, Any]:
    return {"command": command, "requests": 9, "durations_s": dict.fromkeys(rates, 60.0),
            "steps": 3, "seed": 0, "speed": 1, "slo": {"ttft_s": 2, "tpot_s": 0.1, "e2e_s": 30},
            "rates": dict(rates), "cpus": 2, "machine": "x86_64", "python": "3.11",
            "tokenizer": "smollm2-135m", "kv_events": True}


def test_a_later_run_replaces_its_workloads_cells_and_says_so() -> None:
    first = {"meta": run_meta("python -m ridge_bench.compare --out /tmp/a", agent=16, mixed=18),
             "cells": [cell("agent", "ridge", 5.0), cell("mixed", "ridge", 7.0),
                       cell("mixed", "round_robin", 4.0)]}
    later_meta = {**run_meta("python -m ridge_bench.compare --workloads mixed --out /tmp/b",
                             agent=16, mixed=24), "durations_s": {"agent": 60.0, "mixed": 90.0}}
    later = {"meta": later_meta, "cells": [cell("mixed", "ridge", 9.0)]}
    cells, m = merged([first, later])
    by = {(c["workload"], c["router"]): c["summary"]["goodput_rps"] for c in cells}
    assert by == {("agent", "ridge"): 5.0, ("mixed", "ridge"): 9.0,
                  ("mixed", "round_robin"): 4.0}
    assert m["rates"] == {"agent": 16, "mixed": 24}
    assert m["durations_s"] == {"agent": 60.0, "mixed": 90.0}
    assert first["meta"]["rates"]["mixed"] == 18  # the saved runs are not changed
    text = markdown(cells, m)
    assert ("The mixed cells: a later run with the same settings, "
            "`python -m ridge_bench.compare --workloads mixed`.") in text


def test_runs_with_other_settings_are_not_merged() -> None:
    first = {"meta": run_meta("a", mixed=18), "cells": [cell("mixed", "ridge", 7.0)]}
    later = {"meta": {**run_meta("b", mixed=24), "seed": 1}, "cells": [cell("mixed", "ridge", 9.0)]}
    with pytest.raises(ValueError, match="seed"):
        merged([first, later])


def test_one_run_merges_to_itself() -> None:
    run = {"meta": run_meta("a", agent=16), "cells": [cell("agent", "ridge", 5.0)]}
    cells, m = merged([run])
    assert cells == run["cells"] and m["reruns"] == [] and "later run" not in markdown(cells, m)

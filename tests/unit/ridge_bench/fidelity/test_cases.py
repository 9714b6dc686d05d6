"""The fidelity measurements, end to end against the simulated real-demo fleet (fast-forwarded:
the figures do not matter here, only that every case is measured and recorded)."""

from __future__ import annotations

from backends.sim import start_fleet
from config.fleet import load_fleet
from ridge_bench.fidelity.benchmark import FLEET, on_free_ports, setup_for, side_of
from ridge_bench.fidelity.cases import measure


async def test_every_case_is_measured_and_every_prompt_counted() -> None:
    fleet = on_free_ports(load_fleet(str(FLEET)))
    setup = setup_for(fleet, 1, decode_tokens=6, copy_tokens=12, chat_tokens=6,
                      concurrency=(2,), tag="t")
    running = await start_fleet(fleet, speed=50.0)
    try:
        out = await measure(setup, side_of("simulated", fleet))
    finally:
        await running.stop()
    assert sorted(out) == ["chat", "concurrent_2", "copy", "decode", "errors", "long", "prefix",
                           "short"]
    assert len(out["concurrent_2"]["prompt_tokens"]) == 2
    assert len(out["prefix"]["prompt_tokens"]) == 2 and out["prefix"]["cached_ttft_s"]
    assert len(out["copy"]["accepted_per_position"][0]) == 4
    assert out["copy"]["drafts"][0] > 0  # the copy request drafts from its prompt
    assert {e["status"] for e in out["errors"].values()} == {400}

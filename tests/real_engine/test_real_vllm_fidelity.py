"""The simulator keeps the real engine's lever effects and counts prompts as the engine does.

A reduced ``ridge bench fidelity`` (:mod:`ridge_bench.fidelity`): the real side is the tier's
two engines ("plain": prefix caching, 512-token chunks; "spec": n-gram speculation, K = 4); the
simulated side is the real-demo fleet (``gateway/demo/demo-real-fleet.yaml``), whose pools must
have the same levers, simulated in this process at speed 1 with the fleet's tokenizer. Both get
the same requests (:mod:`ridge_bench.fidelity_cases`: 2 repeats, short answers). The test
compares ratios, never wall-clock times, so a busy machine slows it but does not fail it:

- each lever effect — prefix-cache TTFT ratio (cached ÷ cold), concurrency scaling (4 streams'
  total decode rate ÷ one stream's), n-gram speed-up on a copy task and on an ordinary chat
  (spec ÷ plain decode rate) — within 25 % of the real engine's;
- every request's prompt token count equal to the engine's, exactly.

The report's tables are printed (``-s``). The module sorts after the tier's modules that start
engines of their own, so it shares the tier's engines and at most two are ever up.
"""

from __future__ import annotations

import pytest

from backends.fleet_file import load_fleet
from ridge_bench.fidelity import FLEET, plan_for, simulated, spec_and_plain, verdict
from ridge_bench.fidelity_cases import Side, measure
from ridge_bench.fidelity_doc import markdown
from tests.real_engine.conftest import MODEL, Engines

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(1200)]

REDUCED = {"decode_tokens": 32, "copy_tokens": 96, "chat_tokens": 48, "concurrency": (4,),
           "errors": False}
REPEATS = 2


async def test_the_simulator_keeps_the_lever_effects_and_the_token_counts(
        engines: Engines) -> None:
    demo = load_fleet(str(FLEET))
    assert [p.levers for p in spec_and_plain(demo)] == \
        [p.levers for p in spec_and_plain(engines.fleet)], "the demo fleet's levers drifted"
    plan = plan_for(demo, REPEATS, **REDUCED)
    real = await measure(plan, Side("real", engines.plain.url, engines.spec.url, MODEL))
    sim = await simulated(demo, plan)
    print("\n" + markdown(real, sim, {"repeats": REPEATS, "tokens": REDUCED}))
    assert verdict(real, sim) == []

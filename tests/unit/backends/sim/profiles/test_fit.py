"""The profile fit (``backends.sim.profiles.fit``): today's figures give today's constants, known
constants are recovered from the figures they predict, and the fit's TTFT is the simulator's."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import pytest

from backends.sim.profiles import CPU_SMOLLM2, HARDWARE, MODELS
from backends.sim.profiles.calibration import Calibration
from backends.sim.profiles.fit import (
    DecodeFigures,
    Machine,
    PrefillFigure,
    decode_overheads,
    figures_from_truth,
    fit,
    prefill_fit,
    rounded,
    significant,
)
from backends.sim.virtual import simulate
from routing.formulas import SeqWork
from tests.unit.backends.sim.sim_helpers import make_core, make_pool, make_request

SHAPE = MODELS["smollm2-135m"].to_shape(kv_dtype_bytes=2)
MACHINE = Machine(SHAPE, 32.5e9)


@pytest.fixture(scope="module")
def truth() -> dict[str, Any]:
    text = resources.files("backends.sim.profiles").joinpath("ground_truth_cpu.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def test_the_ground_truth_gives_todays_constants(truth: dict[str, Any]) -> None:
    decode, prefills = figures_from_truth(truth)
    result = fit(MACHINE, decode, prefills, start_peak=1e11)
    got, today = result.calibration, CPU_SMOLLM2
    # worked: 1 / 25.4079 = 39.36 ms per step, 4 / 97.0245 = 41.23 ms; weights 538 MB at
    # 32.5 GB/s = 16.55 ms -> seq_s 0.57 ms, step_s 22.2 ms; the TTFTs -> 185 GFLOP/s, 16.6 ms
    assert got.peak_flops == pytest.approx(today.peak_flops, rel=0.02)
    assert got.request_s == pytest.approx(today.request_s, rel=0.05)
    assert got.step_s == pytest.approx(today.step_s, rel=0.02)
    assert got.seq_s == pytest.approx(today.seq_s, rel=0.06)
    assert (got.mem_bandwidth, got.attention_efficiency) == (32.5e9, 1.0)
    assert result.max_relative_error == pytest.approx(0.026, abs=0.002)  # the doc's -2.5 / +2.9 %


def test_known_constants_come_back_from_the_figures_they_predict() -> None:
    known = Calibration(peak_flops=2.4e11, mem_bandwidth=32.5e9, attention_efficiency=1.0,
                        request_s=0.011, step_s=0.015, seq_s=0.0012)
    context = 40 + 64 // 2

    def decode_step(batch: int) -> float:
        roof = MACHINE.cost(known.peak_flops, [SeqWork(1, context)] * batch).seconds
        return roof + known.step_s + known.seq_s * batch

    decode = DecodeFigures(40, 64, 1 / decode_step(1), 4, 4 / decode_step(4))
    prefills = [PrefillFigure(q, c, known.request_s + known.step_s + known.seq_s
                              + MACHINE.cost(known.peak_flops, [SeqWork(q, c)]).seconds)
                for q, c in ((40, 0), (900, 0), (132, 768))]
    result = fit(MACHINE, decode, prefills, start_peak=1e11)
    for field in ("peak_flops", "request_s", "step_s", "seq_s"):
        assert getattr(result.calibration, field) == pytest.approx(getattr(known, field),
                                                                   rel=1e-6), field
    assert result.max_relative_error < 1e-6


def test_the_fits_time_to_first_token_is_the_simulators() -> None:
    profile = HARDWARE["cpu-smollm2"]
    over = profile.overheads
    core = make_core(make_pool(model="smollm2-135m", hardware="cpu-smollm2", chunk=4096))
    trace = simulate(core, [(0.0, make_request("a", 300, 1))])
    roof = Machine(SHAPE, profile.facts.mem_bandwidth).cost(profile.facts.peak_flops,
                                                            [SeqWork(300, 0)]).seconds
    assert trace.first_token("a") == pytest.approx(over.request_s + over.step_s + over.seq_s
                                                   + roof)


def test_decode_figures_that_contradict_the_model_are_refused() -> None:
    faster_together = DecodeFigures(37, 64, 25.0, 4, 120.0)  # 33.3 ms per step at 4 vs 40 at 1
    with pytest.raises(ValueError, match="contradict"):
        decode_overheads(MACHINE, 1.85e11, faster_together)


def test_memory_bound_prefills_are_refused() -> None:
    # one-token prefills are far below the ridge: no peak makes them compute-bound
    tiny = [PrefillFigure(1, 0, 0.04), PrefillFigure(2, 0, 0.041)]
    with pytest.raises(ValueError, match="memory-bound"):
        prefill_fit(MACHINE, 0.02, tiny)


def test_rounding_keeps_three_significant_digits() -> None:
    assert significant(0.016641) == 0.0166
    assert significant(185_285_936_280.8) == 1.85e11
    assert significant(0.0) == 0.0
    assert rounded(Calibration(1.853e11, 3.25e10, 1.0, 0.016641, 0.022181, 0.00057262)) == \
        Calibration(1.85e11, 3.25e10, 1.0, 0.0166, 0.0222, 0.000573)

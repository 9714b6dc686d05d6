"""The calibrated profile's constants are data (``backends/sim/profiles/cpu_smollm2.json``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.sim.profiles import HARDWARE
from backends.sim.profiles.calibration import (
    Calibration,
    from_mapping,
    load_calibration,
    write_calibration,
)


def test_the_cpu_profile_is_built_from_its_file() -> None:
    constants = load_calibration("cpu_smollm2.json")
    profile = HARDWARE["cpu-smollm2"]
    assert (profile.facts.peak_flops, profile.facts.mem_bandwidth) == \
        (constants.peak_flops, constants.mem_bandwidth)
    assert profile.attention_efficiency == constants.attention_efficiency
    over = profile.overheads
    assert (over.request_s, over.step_s, over.seq_s) == \
        (constants.request_s, constants.step_s, constants.seq_s)


def test_a_missing_constant_is_an_error_naming_it() -> None:
    data = {"peak_flops": 1e11, "mem_bandwidth": 3e10, "attention_efficiency": 1,
            "request_s": 0.01, "step_s": "fast"}
    with pytest.raises(ValueError, match=r"f\.json: no numeric step_s, seq_s"):
        from_mapping(data, "f.json")


def test_written_constants_read_back_with_their_notes(tmp_path: Path) -> None:
    constants = Calibration(2e11, 3e10, 1.0, 0.01, 0.02, 0.001)
    path = tmp_path / "c.json"
    write_calibration(path, constants, {"profile": "x"})
    data = json.loads(path.read_text())
    assert data["profile"] == "x"
    assert from_mapping(data, "c.json") == constants

"""``ridge bench calibrate``: the fit of the current figures, the fleet file's rates rewritten
in place, and a dry run that writes nothing."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from backends.sim.profiles import CPU_SMOLLM2
from backends.sim.profiles.calibration import calibration_path
from ridge_bench.fidelity import calibrate
from ridge_bench.fidelity.calibrate import fit_truth, main, sync_rates, table

FLEET = """\
x-cpu: &cpu               # one core
  name: cpu-smollm2       # the profile
  peak_flops: 1.85e+11    # effective FLOP/s
  mem_bandwidth: 3.25e+10 # effective bytes/s

pools:
  - name: gpu
    hardware:
      name: nvidia-l4
      peak_flops: 1.21e+14
"""


def test_only_the_named_profiles_rates_change_and_comments_stay_aligned() -> None:
    new = sync_rates(FLEET, "cpu-smollm2", 1.9e11, 3.3e10)
    assert new.splitlines()[2] == "  peak_flops: 1.9e+11     # effective FLOP/s"
    assert new.splitlines()[3] == "  mem_bandwidth: 3.3e+10  # effective bytes/s"
    assert new.splitlines()[4:] == FLEET.splitlines()[4:]  # the L4 keeps its peak


def test_unchanged_rates_leave_the_file_as_it_is() -> None:
    assert sync_rates(FLEET, "cpu-smollm2", 1.85e11, 3.25e10) == FLEET


def test_the_committed_figures_fit_the_committed_constants() -> None:
    truth = json.loads(calibrate.TRUTH.read_text())
    fitted = fit_truth(truth).calibration
    assert fitted.peak_flops == pytest.approx(CPU_SMOLLM2.peak_flops, rel=0.02)
    assert fitted.step_s == pytest.approx(CPU_SMOLLM2.step_s, rel=0.02)


def test_the_table_puts_old_and_new_side_by_side() -> None:
    lines = table(CPU_SMOLLM2, CPU_SMOLLM2, 0.026).splitlines()
    assert lines[1].split() == ["peak_flops", "1.85e+11", "1.85e+11"]
    assert lines[-1] == "largest relative TTFT error of the fit: 2.6%"


def test_a_dry_run_fits_and_writes_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    files = [calibrate.TRUTH, calibration_path(calibrate.CONSTANTS_FILE),
             calibrate.FLEET_FILE]
    before = [f.read_text() for f in files]
    assert main(["--fit-only", "--dry-run"]) == 0
    assert "largest relative TTFT error" in capsys.readouterr().out
    assert [f.read_text() for f in files] == before


def test_a_failed_measurement_exits_1(monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    def fail(truth: Path, repeats: int, url: str | None, timeout_s: float) -> None:
        raise subprocess.CalledProcessError(1, ["measure"])

    monkeypatch.setattr(calibrate, "measure", fail)
    assert main(["--dry-run"]) == 1
    assert "the measurement failed" in capsys.readouterr().err


def test_the_answer_style_is_written_into_the_fleet_files_mapping() -> None:
    from ridge_bench.fidelity.calibrate import FLEET_FILE, sync_style

    text = FLEET_FILE.read_text()
    knobs = {"copy_slip": 0.1, "repeat_share": 0.5, "repeat_run_tokens": 4.0,
             "repeat_after_tokens": 60}
    new = sync_style(text, knobs)
    assert "{copy_slip: 0.1, repeat_share: 0.5, repeat_run_tokens: 4, repeat_after_tokens: 60}" \
        in new
    assert new.count("copy_slip") == text.count("copy_slip") == 1
    assert sync_style(new, knobs) == new

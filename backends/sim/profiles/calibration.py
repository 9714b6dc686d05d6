"""The fitted constants of a calibrated hardware profile, kept as data beside the profiles.

A calibrated profile (``cpu-smollm2``) reads its free constants from a JSON file in this folder
(``cpu_smollm2.json``) when :mod:`backends.sim.profiles` is imported; ``ridge bench calibrate``
rewrites that file from a new measurement (the fit: :mod:`backends.sim.profiles.fit`). Fields
and units: ``peak_flops`` [FLOP/s, effective], ``mem_bandwidth`` [B/s, effective],
``attention_efficiency`` (fraction of ``peak_flops`` the attention kernels reach),
``request_s`` [s per request], ``step_s`` [s per engine step], ``seq_s`` [s per sequence in a
step]. A missing file or field is an error at import, never a guess.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

FIELDS = ("peak_flops", "mem_bandwidth", "attention_efficiency", "request_s", "step_s", "seq_s")


@dataclass(frozen=True, slots=True)
class Calibration:
    """A profile's fitted constants (module docstring: units)."""

    peak_flops: float
    mem_bandwidth: float
    attention_efficiency: float
    request_s: float
    step_s: float
    seq_s: float


def from_mapping(data: dict[str, Any], source: str) -> Calibration:
    """The constants in ``data``; ValueError naming ``source`` and the missing fields."""
    missing = [f.name for f in fields(Calibration) if not isinstance(data.get(f.name), int | float)]
    if missing:
        raise ValueError(f"{source}: no numeric {', '.join(missing)}")
    return Calibration(**{f.name: float(data[f.name]) for f in fields(Calibration)})


def load_calibration(file_name: str) -> Calibration:
    """The constants in ``file_name`` of this package."""
    text = resources.files(__package__).joinpath(file_name).read_text()
    return from_mapping(json.loads(text), file_name)


def calibration_path(file_name: str) -> Path:
    """Where ``file_name`` of this package lives on disk (for rewriting it)."""
    return Path(__file__).with_name(file_name)


def write_calibration(path: Path, constants: Calibration, notes: dict[str, Any]) -> None:
    """Rewrite ``path``: ``notes`` (provenance) and the constants, one JSON object."""
    path.write_text(json.dumps({**notes, **asdict(constants)}, indent=2) + "\n")

"""One simulated engine's device: the model's shape and the accelerator's peak rates, with the
calibration the roofline cannot know by itself.

The step cost is the roofline of :func:`routing.formulas.step_cost` (every term, with units, in
:mod:`routing.formulas`):

    step time = max(compute time, memory time) + step overhead + seq overhead · batch   [s]

Parameters: ``shape`` (N, L, d, KV heads, head dim, bytes per weight and per KV element: the KV
dtype of the engine's cache, which may differ from the weights') and ``rates`` (peak dense FLOP/s,
memory bandwidth B/s) come from the pool's ``model`` and ``hardware`` facts;
``attention_efficiency`` (≤ 1, default 1) is the fraction of peak the attention kernels reach;
:class:`Overheads` come from the hardware profile (:mod:`backends.sim.profiles`): ``request_s``
(s per request, the API server's work before the engine sees it), ``step_s`` (s per step:
scheduling, kernel launches) and ``seq_s`` (s per sequence in the batch: sampling, detokenising).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from routing.formulas import HardwareRates, ModelShape, SeqWork, StepCost, step_cost


@dataclass(frozen=True, slots=True)
class Overheads:
    """Fixed costs on top of the roofline. Units: seconds per request, per step, per sequence."""

    request_s: float = 0.0
    step_s: float = 0.0
    seq_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Device:
    """What the roofline needs to know about one engine: model shape, peak rates, calibration."""

    shape: ModelShape
    rates: HardwareRates
    attention_efficiency: float = 1.0
    overheads: Overheads = Overheads()

    def step_cost(self, work: Sequence[SeqWork]) -> StepCost:
        """The roofline cost of one step over ``work``, overheads included."""
        return step_cost(self.shape, self.rates, work,
                         attention_efficiency=self.attention_efficiency,
                         step_overhead_s=self.overheads.step_s,
                         seq_overhead_s=self.overheads.seq_s)

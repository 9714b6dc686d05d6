"""gateway.plan.report: the lines that say how the search broke a tie."""

from __future__ import annotations

from gateway.plan.report import headroom
from gateway.plan.search import Problem
from gateway.plan.space import Brief, Part, candidate


def test_the_tied_leaders_are_listed_by_the_fewest_gpus_they_hold_on() -> None:
    problem = Problem((), Brief("llama-3-8b", "nvidia-l4"), gpus=4)
    mix, fp8, one = (candidate(Part("chunk-512", 1), Part("fp8-kv", 3)),
                     candidate(Part("fp8-kv", 4)), candidate(Part("general", 4)))
    assert headroom({mix: 4, fp8: 3, one: 1}, problem) == [
        "3 fleets tie, holding the SLO (99% of requests good); replayed on fewer GPUs in the "
        "same proportions:",
        "  general×4: holds it on 1 GPU",
        "  fp8-kv×4: holds it on 3 GPUs",
        "  chunk-512×1 + fp8-kv×3: not on 3"]
    assert headroom({}, problem) == []

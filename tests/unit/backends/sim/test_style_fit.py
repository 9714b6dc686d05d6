"""The answer style of the real-demo fleet is the fit of the real n-gram engine's counters
(``backends/sim/profiles/ground_truth_ngram.json``, measured by
``tests/real_engine/measure_ngram_style.py``): it reproduces them, and no neighbour on the fit's
grid does better."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from backends.sim.answers import Style
from backends.sim.style_fit import AFTERS, RUNS, free_error, measured, spec_figures
from config.fleet import load_fleet

ROOT = Path(__file__).resolve().parents[4]
TRUTH = json.loads((ROOT / "backends/sim/profiles/ground_truth_ngram.json").read_text())
FREE = [measured(TRUTH, "chat", short=True), measured(TRUTH, "chat", short=False)]
COPY = measured(TRUTH, "copy")


def shipped() -> Style:
    knobs = load_fleet(ROOT / "gateway/demo/demo-real-fleet.yaml").pool("spec").simulator
    return Style(knobs.copy_slip, knobs.repeat_share, knobs.repeat_run_tokens,
                 knobs.repeat_after_tokens)


def neighbours(style: Style) -> list[Style]:
    """The style's neighbours on the fit's grid, one step along each free-text axis."""
    runs, afters = list(RUNS), list(AFTERS)
    out = [replace(style, repeat_share=round(style.repeat_share + d, 2)) for d in (-0.03, 0.03)
           if 0 <= style.repeat_share + d < 0.91]
    i, j = runs.index(style.repeat_run), afters.index(style.repeat_after)
    out += [replace(style, repeat_run=runs[k]) for k in (i - 1, i + 1) if 0 <= k < len(runs)]
    out += [replace(style, repeat_after=afters[k]) for k in (j - 1, j + 1)
            if 0 <= k < len(afters)]
    return out


def test_no_neighbour_on_the_grid_fits_the_free_text_better() -> None:
    best = free_error(shipped(), FREE)
    assert all(best <= free_error(n, FREE) for n in neighbours(shipped()))


@pytest.mark.parametrize("group", [*FREE, COPY], ids=["short free text", "long free text",
                                                      "copy"])
def test_the_shipped_style_reproduces_the_real_share_of_free_tokens(group: object) -> None:
    # accepted drafts per answer token sets the speed-up: 1 / (1 - accepted per token)
    got = spec_figures(group.cases, shipped())  # type: ignore[attr-defined]
    want = group.figures.accepted_per_token  # type: ignore[attr-defined]
    assert got.accepted_per_token == pytest.approx(want, abs=0.06)


def test_plain_pseudo_words_give_speculation_almost_nothing() -> None:
    got = spec_figures(FREE[1].cases, Style())
    assert got.accepted_per_token < 0.05 < FREE[1].figures.accepted_per_token

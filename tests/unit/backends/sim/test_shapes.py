"""The simulator's usage body reports cached prompt tokens only with the engine's flag."""

from __future__ import annotations

import pytest

from backends.sim import shapes
from backends.sim.behaviour import DIALECTS
from tests.unit.backends.sim.sim_helpers import make_pool


@pytest.mark.parametrize(("engine", "flag"), [("vllm", "--enable-prompt-tokens-details"),
                                              ("sglang", "--enable-cache-report")])
def test_cached_tokens_are_reported_with_the_engines_flag_only(engine: str, flag: str) -> None:
    plain, reporting = make_pool(engine=engine), make_pool(engine=engine, engine_args=[flag])
    assert shapes.reported_cached(plain, 48) is None
    assert shapes.reported_cached(reporting, 48) == 48
    use = shapes.usage(DIALECTS[plain.engine], 100, 5)
    assert use["prompt_tokens_details"] is None  # as the engine sends it without the flag
    assert shapes.with_cached(use, None) is use
    assert shapes.with_cached(use, 48)["prompt_tokens_details"] == {"cached_tokens": 48}
    assert shapes.with_cached(use, 48)["prompt_tokens"] == 100


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_prefix_caching_pool_reports_as_ridge_launches_it(engine: str) -> None:
    # ridge's launchers render the cache-report flag for every pool with prefix caching
    assert shapes.reported_cached(make_pool(engine=engine, prefix_caching=True), 48) == 48

from __future__ import annotations

import pytest

from routing.window import (
    CountWindow,
    LengthSummary,
    PairWindow,
    ScopeWindows,
    WorkloadWindows,
    nearest_rank,
)


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([], 0.5, None),
        ([7], 0.5, 7.0),
        ([7], 0.9, 7.0),
        (list(range(1, 11)), 0.5, 5.0),  # rank ceil(0.5·10) = 5
        (list(range(1, 11)), 0.9, 9.0),  # rank 9
        (list(range(1, 11)), 1.0, 10.0),
        ([10, 20, 30], 0.5, 20.0),  # rank ceil(1.5) = 2
        ([10, 20, 30], 0.9, 30.0),  # rank ceil(2.7) = 3
        ([10, 20, 30], 0.01, 10.0),
    ],
)
def test_nearest_rank(values: list[int], q: float, expected: float | None) -> None:
    assert nearest_rank(values, q) == expected


@pytest.mark.parametrize(
    ("size", "added", "expected"),
    [
        (3, [], LengthSummary(0, None, None, None)),
        (3, [5], LengthSummary(1, 5.0, 5.0, 5.0)),
        (3, [30, 10, 20], LengthSummary(3, 20.0, 20.0, 30.0)),
        (3, [1000, 30, 10, 20], LengthSummary(3, 20.0, 20.0, 30.0)),  # 1000 slid out
        (10, list(range(10, 0, -1)), LengthSummary(10, 5.5, 5.0, 9.0)),
    ],
)
def test_count_window_summary(size: int, added: list[int], expected: LengthSummary) -> None:
    window = CountWindow(size)
    for value in added:
        window.add(value)
    assert window.summary() == expected
    assert window.total == sum(added[-size:])


def test_the_running_sum_stays_exact_over_many_slides() -> None:
    window = CountWindow(7)
    for value in range(100_000):
        window.add(value * 3)
    assert window.total == sum(v * 3 for v in range(100_000 - 7, 100_000))


def test_a_window_needs_a_positive_size() -> None:
    with pytest.raises(ValueError):
        CountWindow(0)
    with pytest.raises(ValueError):
        PairWindow(0)


@pytest.mark.parametrize("size", [1, 3, 7])
def test_a_pair_window_keeps_the_last_pairs_and_each_column_s_sum(size: int) -> None:
    window = PairWindow(size)
    pairs = [(v * 3, v % 5) for v in range(50_000)]
    for first, second in pairs:
        window.add(first, second)
        if len(window) < size:
            assert window.totals == tuple(map(sum, zip(*pairs[:len(window)], strict=True)))
    kept = pairs[-size:]
    assert len(window) == size
    assert window.firsts() == [first for first, _ in kept]
    assert window.totals == (sum(f for f, _ in kept), sum(s for _, s in kept))


def test_a_scope_summarises_the_prompts_of_its_window() -> None:
    scope = ScopeWindows(3)
    for prompt, matched in [(1000, 0), (30, 5), (10, 10), (20, 40)]:  # 1000 slides out
        scope.observe(prompt, matched, None)
    measures = scope.measures()
    assert measures.requests == 3
    assert measures.prompt_tokens == LengthSummary(3, 20.0, 20.0, 30.0)
    assert measures.prefix_share == pytest.approx((5 + 10 + 20) / 60)
    assert measures.output_tokens == LengthSummary()


@pytest.mark.parametrize(
    ("observed", "share", "mean_output"),
    [
        ([], None, None),
        ([(0, 0, None)], None, None),  # no prompt tokens yet: f unknown
        ([(100, 25, 10)], 0.25, 10.0),
        ([(100, 25, 10), (300, 300, None), (100, -5, 30)], 325 / 500, 20.0),
        ([(100, 400, None)], 1.0, None),  # clamped to the prompt
        ([(10, 10, 1), (100, 0, 2), (100, 0, 3), (100, 50, 4)], 50 / 300, 3.0),  # size 3
    ],
)
def test_scope_windows(observed: list[tuple[int, int, int | None]], share: float | None,
                       mean_output: float | None) -> None:
    scope = ScopeWindows(3)
    for prompt, matched, output in observed:
        scope.observe(prompt, matched, output)
    assert scope.prefix_share() == pytest.approx(share)
    assert scope.mean_output() == pytest.approx(mean_output)


def test_workload_windows_keep_overall_and_per_model_scopes() -> None:
    windows = WorkloadWindows(size=100, max_models=2)
    windows.observe("a", 100, 100, 10)
    windows.observe("b", 300, 0, 30)
    assert windows.prefix_share("a") == 1.0
    assert windows.prefix_share("b") == 0.0
    assert windows.overall().prefix_share == pytest.approx(0.25)
    assert windows.overall().output_tokens.mean == 20.0
    assert windows.mean_output("b") == 30.0
    assert windows.prefix_share("unseen") is None and windows.mean_output("unseen") is None


def test_the_per_model_scopes_are_a_bounded_lru() -> None:
    windows = WorkloadWindows(size=10, max_models=2)
    for model in ("a", "b", "a", "c"):  # "a" was used after "b": "b" is dropped
        windows.observe(model, 10, 0, 1)
    assert sorted(windows.by_model()) == ["a", "c"]
    assert windows.models() == 2
    assert windows.overall().requests == 4

"""Hand-built snapshots for the scheduler and policy tests."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from routing.features import RequestFeatures
from routing.load import LoadCounts
from routing.scheduler.framework import SchedulingContext, Scorer
from routing.snapshots import EndpointSnapshot, EngineMetrics, PoolSnapshot
from routing.state.protocol import StateView


def ep(url: str, *, running: float | None = None, waiting: float | None = None,
       healthy: bool = True, pool: str = "p") -> EndpointSnapshot:
    return EndpointSnapshot(url, pool, healthy, EngineMetrics(running=running, waiting=waiting))


def features(prompt_tokens: int = 1000, blocks: int | None = None, block_tokens: int = 100,
             output: int = 100, session: str | None = None, model: str = "m") -> RequestFeatures:
    n = prompt_tokens // block_tokens if blocks is None else blocks
    return RequestFeatures(model=model, block_hashes=tuple(range(1, n + 1)),
                           block_tokens=block_tokens, prompt_tokens=prompt_tokens,
                           expected_output_tokens=output, max_tokens=output, session=session,
                           stream=False)


def view(matched: Mapping[str, int] | None = None, load: Mapping[str, int] | None = None,
         prefix_share: float | None = None, session_endpoint: str | None = None) -> StateView:
    return StateView(matched_blocks=dict(matched or {}),
                     load={u: LoadCounts(requests=n) for u, n in (load or {}).items()},
                     prefix_share=prefix_share, session_endpoint=session_endpoint)


def ctx(endpoints: Iterable[EndpointSnapshot], feats: RequestFeatures | None = None,
        state: StateView | None = None, exclude: Iterable[str] = ()) -> SchedulingContext:
    pool = PoolSnapshot("p", "vllm", "mixed", ("m",), tuple(endpoints))
    return SchedulingContext(feats or features(), pool, state or StateView(),
                             exclude=frozenset(exclude))


def scored(totals: Mapping[str, float]) -> tuple[list[EndpointSnapshot], list[float]]:
    """Candidates (in the mapping's order) and their weighted totals, for a picker."""
    return [ep(u) for u in totals], list(totals.values())


def by_url(scorer: Scorer, c: SchedulingContext,
           candidates: Sequence[EndpointSnapshot]) -> dict[str, float]:
    """``scorer``'s scores of ``candidates`` (which it gives in their order), by URL."""
    scores = scorer.score(c, candidates)
    assert len(scores) == len(candidates), scores
    return dict(zip([e.url for e in candidates], scores, strict=True))

"""Prefill pacing: how much prompt an endpoint may be given before its earlier prompts have had
their first token, so that the newest one still gets its first token within its TTFT SLO.
Pure: no I/O.

Admission control (:mod:`routing.admission.capacity`) bounds the requests an engine runs at once,
not
its prefill work: when several slots free up together, the prompts admitted into them prefill
one after another, and the last one's first token comes a prefill per prompt ahead of it
later. Pacing bounds that queue of prefill work per endpoint.

- *Outstanding prefill* P_e [prompt tokens] of an endpoint: the prompts of the streamed
  requests sent to it whose first token has not come yet (this gateway's; a streamed
  request's first token is the end of its prefill, a non-streamed one's is not seen, so those
  are not counted).
- *Prefill rate* R [prompt tokens/s] of a pool: each streamed request's outstanding prefill
  when it was sent, its own prompt included, ÷ its engine-side TTFT (from being sent to its
  first token), exponentially weighted (``weight`` per observation). It is the pace at which
  the engine clears the prefill queued on it as it really runs — chunked with the running
  decodes, other gateways' prompts included — not a peak figure.
- *Cap* [prompt tokens] = R × TTFT SLO × ``target``: the prefill an endpoint clears within
  ``target`` of the SLO, the rest left for the request's wait at the gateway.
- An endpoint is *paced* for a request of T prompt tokens when P_e > 0 and P_e + T > cap.
  One with nothing outstanding always takes the next prompt, however long: pacing delays
  prefill work, it never refuses it. Unknown R (no observation yet) or no TTFT SLO: not paced.
- *Prefill wait* of a request that has to wait [s]: until the prefill past the pool's caps —
  every endpoint's P_e, plus its own prompt and one of its size for each request ahead of it
  — is cleared at the pool's rate (:func:`prefill_wait_s`). Admission control expects a
  request to wait the longer of this and the wait for a free slot.

Prompt tokens are whatever the caller counts them in (the router's estimate); R is learned in
the same unit, so the cap is right whatever the estimate's scale.

Parameters: ``target`` 0.5 (of the TTFT SLO), ``weight`` 0.1.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

NOTHING: frozenset[str] = frozenset()


@dataclass(slots=True)
class PrefillRate:
    """A pool's prefill rate [prompt tokens/s] (module docstring); None before any
    observation. ``weight``: of each new observation."""

    weight: float = 0.1
    tokens_per_s: float | None = None

    def observe(self, tokens: int, engine_ttft_s: float) -> None:
        """``tokens`` of prefill were outstanding (this request's included) when a request was
        sent, and its first token came ``engine_ttft_s`` later (4,800 tokens in 0.6 s → 8,000
        tokens/s). Ignored when either is not positive."""
        if tokens <= 0 or engine_ttft_s <= 0:
            return
        rate = tokens / engine_ttft_s
        mean = self.tokens_per_s
        self.tokens_per_s = rate if mean is None else mean + self.weight * (rate - mean)


def prefill_cap(tokens_per_s: float, ttft_slo_s: float, target: float) -> float:
    """The prefill an endpoint may have outstanding [prompt tokens]: R × SLO × target (8,000
    tokens/s, SLO 1 s, target 0.5 → 4,000)."""
    return tokens_per_s * ttft_slo_s * target


def paced_endpoints(outstanding: Mapping[str, int], own_tokens: int,
                    cap_of: Callable[[str], float | None]) -> frozenset[str]:
    """The endpoints of ``outstanding`` (URL → outstanding prefill, > 0) that may not take a
    prompt of ``own_tokens`` now: outstanding + own > the cap ``cap_of`` gives for the URL
    (None: not paced). Allocates nothing when none is paced."""
    paced: set[str] | None = None
    for url, tokens in outstanding.items():
        cap = cap_of(url)
        if cap is not None and tokens + own_tokens > cap:
            if paced is None:
                paced = set()
            paced.add(url)
    return frozenset(paced) if paced else NOTHING


def prefill_wait_s(outstanding: int, own_tokens: int, ahead: int, endpoints: int,
                   cap: float, tokens_per_s: float) -> float:
    """[s] until a pool of ``endpoints`` endpoints has prefill room for a request of
    ``own_tokens`` with ``ahead`` requests of its size before it: the prefill past the pool's
    caps — ``outstanding`` (all its endpoints') + (ahead + 1) × own − endpoints × cap — cleared
    at endpoints × R (4,800 outstanding, a 2,400-token prompt, none ahead, 2 endpoints, cap
    3,000, R 6,000 → (4,800 + 2,400 − 6,000) ÷ 12,000 = 0.1 s); 0 when it fits now."""
    excess = outstanding + (ahead + 1) * own_tokens - endpoints * cap
    return max(0.0, excess / (endpoints * tokens_per_s)) if excess > 0 else 0.0

"""Prefill pacing: how much prompt an endpoint may be given before its earlier prompts have had
their first token, so that the newest one still gets its first token within its TTFT SLO.
Pure: no I/O.

Admission control (:mod:`routing.admission.capacity`) bounds the requests an engine runs at
once, not its prefill work; pacing bounds the prefill queued per endpoint. P_e [prompt tokens]:
an endpoint's outstanding prefill (streamed requests sent to it still without a first token);
R [prompt tokens/s]: a pool's prefill rate as its engines really run (:class:`PrefillRate`);
cap [prompt tokens] = R × TTFT SLO × ``target`` (:func:`prefill_cap`). An endpoint is paced for
a prompt of T tokens when P_e > 0 and P_e + T > cap (:func:`paced_endpoints`): one with nothing
outstanding always takes the next prompt; no TTFT SLO: not paced. Before a pool's first
observation R is its roofline prior (:func:`roofline_prefill_rate`), so a cold burst is paced
from its first request; the first observation replaces it.
:func:`prefill_wait_s` [s] is a waiting request's wait for prefill room. Prompt tokens are in
the caller's unit, and R is learned in it.

See docs/routing.md#prefill-pacing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from routing.formulas import HardwareRates, ModelShape, SeqWork, step_cost

NOTHING: frozenset[str] = frozenset()


@dataclass(slots=True)
class PrefillRate:
    """A pool's prefill rate [prompt tokens/s]: the outstanding prefill when a request was sent
    (its own prompt included) ÷ its engine-side TTFT, exponentially weighted; None before any
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


@dataclass(slots=True)
class _Peers:
    seen: int = 0
    tokens: int = 0
    until: float = 0.0


class PeerPrefill:
    """The prefill other gateways (or workers) sharing the router state placed on each
    endpoint, estimated from the shared in-flight counts, which say how many requests are
    there but not whose prompt is still prefilling: when the requests on an endpoint that are
    not this gateway's rise by k since last seen, k × T prompt tokens are outstanding there
    (T: the prompt being placed, taken as the size of theirs), until they would have been
    prefilled at the pool's rate R (the tokens ÷ R seconds after the last rise). A count that
    falls changes only what is seen. Times in seconds."""

    __slots__ = ("_peers",)

    def __init__(self) -> None:
        self._peers: dict[str, _Peers] = {}

    @property
    def urls(self) -> tuple[str, ...]:
        return tuple(self._peers)

    def observe(self, url: str, others: int, tokens: int, per_s: float | None,
                now: float) -> None:
        """``others`` requests not this gateway's are in flight on ``url`` at ``now``."""
        peers = self._peers.get(url)
        if peers is None:
            if others <= 0:
                return
            peers = self._peers[url] = _Peers()
        if now >= peers.until:
            peers.tokens = 0
        if others > peers.seen and per_s:
            peers.tokens += (others - peers.seen) * tokens
            peers.until = now + peers.tokens / per_s
        peers.seen = others

    def outstanding(self, url: str, now: float) -> int:
        """The peers' prompt tokens taken as still prefilling on ``url`` at ``now``."""
        peers = self._peers.get(url)
        return peers.tokens if peers is not None and now < peers.until else 0


def roofline_prefill_rate(shape: ModelShape, rates: HardwareRates, chunk_tokens: int,
                          efficiency: float) -> float:
    """A pool's prior prefill rate [prompt tokens/s]: one engine step computing a chunk of
    ``chunk_tokens`` new tokens on the roofline (:func:`routing.formulas.step_cost`), times
    ``efficiency``, the share of that an engine reaches (Llama-3-8B fp16 on an L4, chunk 512:
    2·8.03e9·512 FLOP ÷ 121 TFLOP/s ≈ 68 ms ≥ 16.1 GB ÷ 300 GB/s ≈ 54 ms, so ≈ 7,500
    tokens/s; × 0.5 ≈ 3,750)."""
    step = step_cost(shape, rates, [SeqWork(chunk_tokens, 0)])
    return efficiency * chunk_tokens / step.seconds if step.seconds > 0 else 0.0


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

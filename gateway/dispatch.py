"""From a parsed request to an engine's response headers: measure, route, reserve, send.

Order of events: extract the request's features; read the router state once (prefix
matches, loads, prefix share, session); let the router plan (lever policy → pool → replica,
or a prefill/decode pair); reserve the chosen endpoint(s) in the state; send — to one endpoint,
or through the pool engine's P/D hand-off protocol.

When every pool's scheduler can run inside the state (:attr:`routing.router.Router.atomic`),
the middle steps go the atomic way instead: the policy chooses the pool on the state's local
``peek`` (no I/O), the pool's filters run on the snapshot, and ONE
``select_and_reserve`` call scores, picks and reserves the replica(s) — one round trip to a
shared state, and no two gateways can both take the endpoint they both saw idle.

An endpoint that refuses or resets before the first byte is marked failed, its reservation
released, and the request re-planned without it (``retries`` times, then 502).
No pool serves the model: 404; none can take it: 503; no response headers in time: 504.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from backends.client import BackendClient, UpstreamConnectError, UpstreamResponse, UpstreamTimeout
from backends.pd_client import PD_PROTOCOLS, Handoff
from gateway.errors import GatewayError
from gateway.openai_request import ParsedRequest
from routing.features import FeatureExtractor, RequestFeatures, with_learned_output
from routing.router import Placement, RoutePlan, Router
from routing.select import Candidate, Group, SelectRequest
from routing.state import Outcome, Reservation, RouterState, StateView
from routing.types import EndpointSnapshot, PoolSnapshot

FORWARD_HEADERS: Mapping[str, str] = MappingProxyType(
    {"content-type": "application/json", "accept": "*/*"}
)
SESSION_HEADER = "x-session-id"


class EndpointBook(Protocol):
    """What dispatch needs of the endpoint registry."""

    def snapshot(self) -> tuple[PoolSnapshot, ...]: ...

    def acquire(self, url: str) -> None: ...

    def release(self, url: str) -> None: ...

    def mark_failed(self, url: str, reason: str) -> None: ...


@dataclass
class Dispatched:
    """A request sent: where it went, its reservations and the response (headers in)."""

    features: RequestFeatures
    view: StateView
    plan: RoutePlan
    response: UpstreamResponse
    reservations: list[Reservation] = field(default_factory=list)
    handoff: Handoff | None = None
    endpoint_index: int = 0


    @property
    def endpoints(self) -> list[EndpointSnapshot]:
        return [e for e in (self.plan.prefill, self.plan.endpoint) if e is not None]

    @property
    def matched_tokens(self) -> int:
        """Prompt tokens that matched on some endpoint before this request (tokens)."""
        best = max(self.view.matched_blocks.values(), default=0)
        return self.features.matched_tokens(best)


@dataclass
class Attempts:
    """What the retries of one request have seen."""

    tried: set[str] = field(default_factory=set)
    last_error: str | None = None
    failures: int = 0


class Dispatcher:
    """Routes and sends requests; one per app."""

    def __init__(
        self,
        book: EndpointBook,
        client: BackendClient,
        router: Router,
        state: RouterState,
        extractor: FeatureExtractor,
        retries: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._book, self._client, self._router = book, client, router
        self._state, self._extractor = state, extractor
        self._retries, self._clock = retries, clock

    async def dispatch(
        self, parsed: ParsedRequest, session_hint: str | None, attempts: Attempts
    ) -> Dispatched:
        pools = self._book.snapshot()
        if not any(p.serves(parsed.model) for p in pools):
            raise GatewayError(
                404,
                f"The model '{parsed.model}' does not exist",
                param="model",
                code="model_not_found",
            )
        features, view = await self._measure(parsed, pools, session_hint)
        for _ in range(1 + self._retries):
            routed = await self._route(parsed, features, pools, view, attempts)
            if routed is None:
                break
            plan, held, seen = routed
            sent = await self._try(parsed, features, seen, plan, attempts, held)
            if sent is not None:
                sent.endpoint_index = _index_of(plan.endpoint, pools)
                return sent
            pools = self._book.snapshot()
        if not attempts.tried:
            raise GatewayError(
                503,
                f"no healthy endpoint serves the model '{parsed.model}'",
                code="no_healthy_endpoint",
            )
        raise GatewayError(
            502,
            f"upstream unreachable after {len(attempts.tried)} attempt(s): {attempts.last_error}",
            code="upstream_unreachable",
        )

    async def _measure(
        self, parsed: ParsedRequest, pools: tuple[PoolSnapshot, ...], session_hint: str | None
    ) -> tuple[RequestFeatures, StateView]:
        features = await self._extractor.extract(
            parsed.payload,
            "chat" if parsed.endpoint.name == "CHAT" else "completions",
            parsed.model,
            parsed.max_tokens,
            parsed.stream,
            session_hint,
        )
        urls = [e.url for p in pools if p.serves(parsed.model) for e in p.endpoints]
        if self._router.atomic:
            view = self._state.peek(parsed.model, features.block_hashes, features.session, urls)
        else:
            view = await self._state.read(
                parsed.model, features.block_hashes, features.session, urls
            )
        features = with_learned_output(
            features, view.expected_output_tokens, self._extractor.config
        )
        return features, view

    async def _route(
        self,
        parsed: ParsedRequest,
        features: RequestFeatures,
        pools: tuple[PoolSnapshot, ...],
        view: StateView,
        attempts: Attempts,
    ) -> tuple[RoutePlan, list[Reservation], StateView] | None:
        """Plan and reserve: the plan, its reservations and the view it was chosen on."""
        exclude = frozenset(attempts.tried)
        if not self._router.atomic:
            plan = self._router.plan(features, pools, view, self._clock(), exclude)
            if plan is None:
                return None
            return plan, await self._hold(plan, features), view
        placement = self._router.place(features, pools, view, self._clock(), exclude)
        if placement is None:
            return None
        urls = [e.url for p in pools if p.serves(parsed.model) for e in p.endpoints]
        selection = await self._state.select_and_reserve(
            _select_request(features, placement, urls)
        )
        plan = _plan_of(placement, selection.endpoints)
        for ep in (plan.prefill, plan.endpoint):
            if ep is not None:
                self._book.acquire(ep.url)
        return plan, list(selection.reservations), selection.view

    async def _try(
        self,
        parsed: ParsedRequest,
        features: RequestFeatures,
        view: StateView,
        plan: RoutePlan,
        attempts: Attempts,
        held: list[Reservation],
    ) -> Dispatched | None:
        """One attempt; None when an endpoint refused before the first byte."""
        try:
            response, handoff = await self._send(parsed, plan)
        except UpstreamConnectError as exc:
            await self._release(held, plan, features, parsed, succeeded=False)
            for ep in (plan.prefill, plan.endpoint):
                if ep is not None:
                    attempts.tried.add(ep.url)
                    self._book.mark_failed(ep.url, str(exc))
            attempts.last_error = str(exc)
            attempts.failures += 1
            return None
        except UpstreamTimeout as exc:
            await self._release(held, plan, features, parsed, succeeded=False)
            raise GatewayError(
                504, f"the engine did not answer in time: {exc}", code="upstream_timeout"
            ) from exc
        except BaseException:
            await self._release(held, plan, features, parsed, succeeded=False)
            raise
        attempts.tried.update(e.url for e in (plan.prefill, plan.endpoint) if e is not None)
        return Dispatched(features, view, plan, response, held, handoff)

    async def _send(
        self, parsed: ParsedRequest, plan: RoutePlan
    ) -> tuple[UpstreamResponse, Handoff | None]:
        path = parsed.endpoint.value
        if plan.prefill is None:
            body = parsed.body
            return await self._client.send(plan.endpoint.url + path, body, FORWARD_HEADERS), None
        engine = _engine_of(plan.prefill.pool, self._book.snapshot())
        handoff = await PD_PROTOCOLS[engine].run(
            self._client,
            plan.prefill.url,
            plan.endpoint.url,
            path,
            dict(parsed.payload),
            FORWARD_HEADERS,
        )
        return handoff.response, handoff

    async def _hold(self, plan: RoutePlan, features: RequestFeatures) -> list[Reservation]:
        tokens = features.prompt_tokens + features.expected_output_tokens
        held = []
        for ep in (plan.prefill, plan.endpoint):
            if ep is not None:
                self._book.acquire(ep.url)
                held.append(await self._state.reserve(ep.url, tokens, features.block_hashes))
        return held

    async def _release(
        self,
        held: list[Reservation],
        plan: RoutePlan,
        features: RequestFeatures,
        parsed: ParsedRequest,
        *,
        succeeded: bool,
        output_tokens: int | None = None,
        matched_tokens: int = 0,
        prompt_tokens: int | None = None,
    ) -> None:
        outcome = Outcome(
            model=parsed.model,
            block_hashes=features.block_hashes,
            prompt_tokens=prompt_tokens or features.prompt_tokens,
            matched_tokens=min(matched_tokens, prompt_tokens or features.prompt_tokens),
            output_tokens=output_tokens,
            session=features.session,
            succeeded=succeeded,
        )
        for reservation in held:
            self._book.release(reservation.endpoint)
            await self._state.finish(reservation, outcome)

    async def finish(
        self,
        sent: Dispatched,
        parsed: ParsedRequest,
        *,
        succeeded: bool,
        output_tokens: int | None,
        prompt_tokens: int | None,
    ) -> None:
        """Release the request's reservations and teach the state what it learned."""
        if sent.handoff is not None:
            await sent.handoff.close()
        else:
            await sent.response.close()
        await self._release(
            sent.reservations,
            sent.plan,
            sent.features,
            parsed,
            succeeded=succeeded,
            output_tokens=output_tokens,
            matched_tokens=sent.matched_tokens,
            prompt_tokens=prompt_tokens,
        )


def _select_request(
    features: RequestFeatures, placement: Placement, urls: list[str]
) -> SelectRequest:
    groups = tuple(
        Group(tuple(Candidate(ep.url, ep.in_flight, ep.metrics.queued) for ep in side.candidates),
              side.weights)
        for side in placement.sides
    )
    return SelectRequest(
        model=features.model,
        block_hashes=features.block_hashes,
        session=features.session,
        endpoints=urls,
        groups=groups,
        prompt_tokens=features.prompt_tokens,
        block_tokens=features.block_tokens,
        tokens=features.prompt_tokens + features.expected_output_tokens,
    )


def _plan_of(placement: Placement, chosen: tuple[str, ...]) -> RoutePlan:
    """The route plan of a placement whose sides the state picked ``chosen`` from."""
    picked = [
        next(ep for ep in side.candidates if ep.url == url)
        for side, url in zip(placement.sides, chosen, strict=True)
    ]
    if len(picked) == 1:
        return RoutePlan(placement.decision, picked[0])
    return RoutePlan(placement.decision, picked[1], picked[0])


def _index_of(endpoint: EndpointSnapshot, pools: tuple[PoolSnapshot, ...]) -> int:
    """``endpoint``'s position in its pool's configured endpoint list."""
    for pool in pools:
        for i, ep in enumerate(pool.endpoints):
            if ep.url == endpoint.url:
                return i
    return -1


def _engine_of(pool: str, pools: tuple[PoolSnapshot, ...]) -> str:
    for p in pools:
        if p.name == pool:
            return p.engine
    raise KeyError(pool)

"""From a parsed request to an engine's response headers: measure, route and reserve, send.

:class:`Dispatcher` extracts the request's features once, lets the router state place it
(:meth:`RouterState.place`: view, router — lever policy, then the pool's scheduler plugins —
and reservation, atomically), and sends it to one endpoint or through the pool engine's P/D
hand-off. An endpoint that fails before the first byte is marked failed and the request placed
again without it (``retries`` times, then 502); a 503 is passed over the same way without
marking it. No pool for the model: 404; none can take it: 503; no headers in time: 504.

With admission control (:mod:`gateway.access.admission`) placing goes through it, and every
release and first token is reported to it. The APIs that generate nothing are routed by load
alone (:func:`load_router`). See docs/gateway.md#dispatch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Protocol

from backends.upstream.client import (
    BackendClient,
    UpstreamConnectError,
    UpstreamResponse,
    UpstreamTimeout,
)
from backends.upstream.pd import PD_PROTOCOLS, Handoff
from config.engines import Engine
from config.fleet import Fleet, FleetConfigError
from gateway.access.admission import Placement, Route
from gateway.request.body import NO_INFERENCE, ApiPath, ParsedRequest
from gateway.server.errors import GatewayError
from routing.features import FeatureConfig, RequestFeatures, RequestInfo
from routing.load import request_tokens
from routing.policy import LeverPolicy, PolicyConfig
from routing.router import RoutePlan, Router
from routing.snapshots import MIXED, PoolSnapshot
from routing.state.protocol import Ask, Outcome, Placed, Reservation, RouterState, StateView
from routing.tokens.counters import estimate_tokens

FORWARD_HEADERS: Mapping[str, str] = MappingProxyType(
    {"content-type": "application/json", "accept": "*/*"}
)
NO_HEADERS: Mapping[str, str] = MappingProxyType({})
SESSION_HEADER = "x-session-id"
FEATURE_KINDS: Mapping[ApiPath, str] = MappingProxyType({
    ApiPath.CHAT: "chat", ApiPath.COMPLETIONS: "completions", ApiPath.RESPONSES: "responses"})
"""The request kind :mod:`routing.features` reads each generation API's prompt as; an API
missing here is routed by load alone (module docstring)."""
MAX_MODELS_KEPT = 1024
"""How many model names the dispatcher keeps the endpoints of (:meth:`Dispatcher._urls_of`)."""
EngineHeaders = Mapping[str, Mapping[str, str]]
"""The headers sent to each pool's engines, by pool name (missing: :data:`FORWARD_HEADERS`)."""


ModelNames = Mapping[str, Mapping[str, str]]
"""Per pool, a served name → the ``model`` its engines take for it (missing: as sent)."""


def engine_model_names(fleet: Fleet) -> ModelNames:
    """Per SGLang pool with LoRA adapters: adapter → ``BASE:ADAPTER``, the ``model`` SGLang
    applies an adapter for (it does not look adapters up by their own names; vLLM does)."""
    return MappingProxyType({
        pool.name: MappingProxyType({a: f"{pool.models[0]}:{a}" for a in pool.adapter_names()})
        for pool in fleet.pools if pool.engine is Engine.SGLANG and pool.adapters})


def engine_headers(fleet: Fleet, environ: Mapping[str, str]) -> EngineHeaders:
    """Per pool with an ``api_key_env``: :data:`FORWARD_HEADERS` and ``Authorization: Bearer``
    with the key read from that environment variable. Raises FleetConfigError when the
    variable is unset or empty (the error names the variable, never a key)."""
    headers = {}
    for pool in fleet.pools:
        if pool.api_key_env is None:
            continue
        key = environ.get(pool.api_key_env, "")
        if not key:
            raise FleetConfigError(f"pool {pool.name!r}: api_key_env {pool.api_key_env} is "
                                   "not set in the environment")
        headers[pool.name] = MappingProxyType({**FORWARD_HEADERS,
                                               "authorization": f"Bearer {key}"})
    return MappingProxyType(headers)


class ProbeAuth:
    """Per endpoint URL, its pool's engine API key as the ``Authorization`` header of the
    registry's probes (:class:`backends.engines.probe.HttpProbe`: an engine started with an API key
    may
    guard its metrics and server-info pages). ``fleet_of``: the fleet in use now (its keys are
    read from ``environ`` again only when it changes, at a reload); ``pool_of``: an endpoint's
    pool (None: not in the fleet)."""

    def __init__(self, fleet_of: Callable[[], Fleet], pool_of: Callable[[str], str | None],
                 environ: Mapping[str, str]) -> None:
        self._fleet_of, self._pool_of, self._environ = fleet_of, pool_of, environ
        self._fleet: Fleet | None = None
        self._by_pool: Mapping[str, Mapping[str, str]] = {}

    def __call__(self, url: str) -> Mapping[str, str]:
        fleet = self._fleet_of()
        if fleet is not self._fleet:
            self._fleet = fleet
            self._by_pool = {pool: MappingProxyType({"authorization": h["authorization"]})
                             for pool, h in engine_headers(fleet, self._environ).items()}
        pool = self._pool_of(url) if self._by_pool else None
        return self._by_pool.get(pool, NO_HEADERS) if pool is not None else NO_HEADERS


class RegistryView(Protocol):
    """What dispatch needs of the endpoint registry."""

    def snapshot(self) -> tuple[PoolSnapshot, ...]: ...

    def mark_failed(self, url: str, reason: str) -> None: ...

    def mark_succeeded(self, url: str) -> None: ...


class FeatureSource(Protocol):
    """What dispatch needs of the feature extractor (:class:`routing.features.FeatureExtractor`,
    compiled with the routing modules where they are)."""

    @property
    def config(self) -> FeatureConfig: ...

    def extract(self, payload: dict[str, Any], info: RequestInfo) -> RequestFeatures: ...


class AdmissionControl(Protocol):
    """What the request path needs of admission control
    (:class:`gateway.access.admission.Admission`; its capacities for the gauges)."""

    async def place(self, state: RouterState, ask: Ask, route: Route) -> Placement: ...

    def released(self, url: str) -> None: ...

    def observed_ttft(self, pool: str, engine_ttft_s: float) -> None: ...

    def prefill_started(self, url: str, tokens: int) -> int: ...

    def prefill_done(self, url: str, tokens: int, ahead: int,
                     engine_ttft_s: float | None) -> None: ...

    def capacities(self) -> list[tuple[str, str, int]]: ...


class Dispatched:
    """A request sent: where it went, its reservations and the response (headers in);
    ``prefill_ahead``: admission control's outstanding prefill on the endpoint when sent, this
    request's included [tokens] (0: not counted, or its first token has come). A plain class:
    compiled, made with no call into the interpreter."""

    __slots__ = ("features", "view", "plan", "response", "reservations", "handoff",
                 "endpoint_index", "waited_s", "prefill_ahead")

    def __init__(self, features: RequestFeatures, view: StateView, plan: RoutePlan,
                 response: UpstreamResponse, reservations: list[Reservation] | None = None,
                 handoff: Handoff | None = None) -> None:
        self.features, self.view, self.plan, self.response = features, view, plan, response
        self.reservations: list[Reservation] = [] if reservations is None else reservations
        self.handoff = handoff
        self.endpoint_index = 0
        self.waited_s = 0.0
        self.prefill_ahead = 0

    @property
    def matched_tokens(self) -> int:
        """Prompt tokens that matched on some endpoint before this request (tokens)."""
        best = 0
        for blocks in self.view.matched_blocks.values():  # a loop: no generic max() call
            if blocks > best:
                best = blocks
        return self.features.matched_tokens(best)

    @property
    def predicted_tokens(self) -> int | None:
        """Prompt tokens the prefix index said the chosen endpoint held when the request was
        placed (tokens): the reuse the router counted on there. None for a prefill/decode
        pair (the engine's cached count is not one endpoint's)."""
        if self.plan.prefill is not None:
            return None
        blocks = self.view.matched_blocks.get(self.plan.endpoint.url, 0)
        return self.features.matched_tokens(blocks)


class Attempts:
    """What the retries of one request have seen: the endpoints ``tried``, the last error,
    the ``failures`` and of them the ``broken`` ones (engines that answered 200 with a broken
    body), and the last route placed, ``plan`` (None: never placed; its pool is the one a
    request that failed before any engine's headers is counted under). A plain class:
    compiled, made with no call into the interpreter."""

    __slots__ = ("tried", "last_error", "failures", "broken", "plan")

    def __init__(self) -> None:
        self.tried: set[str] = set()
        self.last_error: str | None = None
        self.failures = 0
        self.broken = 0
        self.plan: RoutePlan | None = None


class Dispatcher:
    """Routes and sends requests; one per app."""

    def __init__(
        self,
        registry: RegistryView,
        client: BackendClient,
        router: Router,
        state: RouterState,
        extractor: FeatureSource,
        retries: int,
        headers: EngineHeaders = MappingProxyType({}),
        admission: AdmissionControl | None = None,
        model_names: ModelNames = MappingProxyType({}),
    ) -> None:
        self._registry, self._client, self._router = registry, client, router
        self._state, self._extractor, self._retries = state, extractor, retries
        self._headers = headers
        self._admission = admission
        self._model_names = model_names
        self._by_load = load_router(router)
        self._urls_pools: tuple[PoolSnapshot, ...] | None = None
        self._urls: dict[str, tuple[str, ...]] = {}

    @property
    def admission(self) -> AdmissionControl | None:
        """Admission control on this request path (None: off)."""
        return self._admission

    async def dispatch(
        self, parsed: ParsedRequest, session_hint: str | None, attempts: Attempts, *,
        key: str | None = None, slo_class: str | None = None,
    ) -> Dispatched:
        """Route, reserve and send ``parsed``. ``key``: whom admission control's queues are fair
        between (None: the request's ``user``); ``slo_class``: the class the client named."""
        pools = self._registry.snapshot()
        urls = self._urls_of(pools, parsed.model)
        if not urls:
            raise GatewayError(
                404,
                f"The model '{parsed.model}' does not exist",
                param="model",
                code="model_not_found",
            )
        kind = FEATURE_KINDS.get(parsed.api_path)
        if kind is None:
            router, pools, features = self._by_load, as_whole_pools(pools), self._sized(parsed)
        else:
            router, features = self._router, self._features(kind, parsed, session_hint)
        ask = Ask(parsed.model, features.block_hashes, features.session, urls,
                  request_tokens(features.prompt_tokens, features.expected_output_tokens))
        who = key if key is not None else parsed.user
        for _ in range(1 + self._retries - attempts.failures):
            placed, waited_s = await self._place(router, ask, features, pools,
                                                 frozenset(attempts.tried), who, slo_class)
            if placed is None:
                break
            attempts.plan = placed.choice
            ahead = self._prefill_started(parsed, placed.choice, features)
            sent = await self._try(parsed, features, placed, attempts)
            if sent is not None:
                sent.endpoint_index = _index_of(placed.choice.endpoint.url, pools)
                sent.waited_s = waited_s
                sent.prefill_ahead = ahead
                return sent
            if ahead and self._admission is not None:
                self._admission.prefill_done(placed.choice.first.url, features.prompt_tokens,
                                             ahead, None)
            pools = self._registry.snapshot() if kind is not None else \
                as_whole_pools(self._registry.snapshot())
        if not attempts.tried:
            raise GatewayError(
                503,
                f"no healthy endpoint serves the model '{parsed.model}'",
                code="no_healthy_endpoint",
            )
        if attempts.broken:
            raise GatewayError(
                502, f"no engine gave a whole answer after {attempts.failures} attempt(s)",
                code="upstream_broken", detail=attempts.last_error)
        raise GatewayError(
            502,
            f"no engine could take the request after {len(attempts.tried)} attempt(s)",
            code="upstream_unreachable",
            detail=attempts.last_error,
        )

    def _urls_of(self, pools: tuple[PoolSnapshot, ...], model: str) -> tuple[str, ...]:
        """The endpoints of ``pools`` that serve ``model``, kept until the registry's snapshot
        changes (at most :data:`MAX_MODELS_KEPT` models: the name is the client's)."""
        if pools is not self._urls_pools:
            self._urls_pools, self._urls = pools, {}
        urls = self._urls.get(model)
        if urls is None:
            if len(self._urls) >= MAX_MODELS_KEPT:
                self._urls.clear()
            urls = self._urls[model] = tuple(
                e.url for p in pools if p.serves(model) for e in p.endpoints)
        return urls

    def _features(self, kind: str, parsed: ParsedRequest,
                  session_hint: str | None) -> RequestFeatures:
        info = RequestInfo(kind, parsed.model, parsed.max_tokens, parsed.stream, session_hint,
                           self._state.learned_output(parsed.model))
        return self._extractor.extract(parsed.payload, info)

    def _sized(self, parsed: ParsedRequest) -> RequestFeatures:
        """An API that generates nothing, as the router sees it: its size alone — prompt
        tokens estimated from the body's length (as a key's charge is), no output."""
        config = self._extractor.config
        return RequestFeatures(
            model=parsed.model, block_hashes=(), block_tokens=config.block_tokens,
            prompt_tokens=estimate_tokens(len(parsed.body), config.chars_per_token),
            expected_output_tokens=0, max_tokens=None, session=None, stream=False)

    async def _place(self, router: Router, ask: Ask, features: RequestFeatures,
                     pools: tuple[PoolSnapshot, ...], exclude: frozenset[str], key: str | None,
                     slo_class: str | None) -> Placement:
        """``router``'s plan for the request, reserved by the state (through admission control
        when it is on), and how long it waited for room [s]."""
        if self._admission is not None:
            route = Route(router, features, pools, exclude, key, slo_class)
            return await self._admission.place(self._state, ask, route)
        choose = router.choose
        placed = await self._state.place(ask, lambda view: choose(features, pools, view, exclude))
        return placed, 0.0

    async def _try(
        self, parsed: ParsedRequest, features: RequestFeatures, placed: Placed[RoutePlan],
        attempts: Attempts,
    ) -> Dispatched | None:
        """One attempt; None when it may go elsewhere: an endpoint refused or reset before the
        first byte, answered no valid HTTP status (both marked failed), or said it is
        overloaded (503) while retries remain."""
        plan, held = placed.choice, list(placed.reservations)
        try:
            response, handoff = await self._send(parsed, plan)
        except UpstreamConnectError as exc:
            await self._release(held, features, parsed, succeeded=False)
            self._refused(plan, attempts, str(exc), failed=True)
            return None
        except UpstreamTimeout as exc:
            await self._release(held, features, parsed, succeeded=False)
            raise GatewayError(504, "the engine did not answer in time",
                               code="upstream_timeout", detail=str(exc)) from exc
        except BaseException:
            await self._release(held, features, parsed, succeeded=False)
            raise
        status = response.status
        invalid = not 100 <= status <= 599
        if invalid or (status == 503 and attempts.failures < self._retries):
            await (handoff.close() if handoff is not None else response.close())
            await self._release(held, features, parsed, succeeded=False)
            why = f"answered the invalid HTTP status {status}" if invalid else "overloaded (503)"
            self._refused(plan, attempts, why, failed=invalid)
            return None
        attempts.tried.update(plan.urls)
        return Dispatched(features, placed.view, plan, response, held, handoff)

    def _refused(self, plan: RoutePlan, attempts: Attempts, why: str, failed: bool) -> None:
        """Count a refused attempt; ``failed``: mark its endpoints failed in the registry."""
        for url in plan.urls:
            attempts.tried.add(url)
            if failed:
                self._registry.mark_failed(url, why)
        attempts.last_error = why
        attempts.failures += 1

    def may_retry(self, attempts: Attempts) -> bool:
        """Whether a request whose attempts failed ``attempts.failures`` times (the last one
        counted) may be sent again: at most ``retries`` times."""
        return attempts.failures <= self._retries

    def answer_broken(self, sent: Dispatched, attempts: Attempts, why: str) -> None:
        """``sent`` answered 200 with a broken body before any of it reached the client: its
        endpoints counted as failing, and not tried again for this request."""
        self._refused(sent.plan, attempts, why, failed=True)
        attempts.broken += 1

    def engine_failed(self, sent: Dispatched, why: str) -> None:
        """The engine's answer broke off or broke a limit: count its endpoint as failing."""
        for url in sent.plan.urls:
            self._registry.mark_failed(url, why)

    async def _send(
        self, parsed: ParsedRequest, plan: RoutePlan
    ) -> tuple[UpstreamResponse, Handoff | None]:
        path: str = parsed.api_path  # a StrEnum: its own path
        headers = self._headers.get(plan.endpoint.pool, FORWARD_HEADERS)
        if self._model_names:
            parsed = _engine_model(parsed, self._model_names.get(plan.endpoint.pool))
        if plan.prefill is None:
            return await self._client.send(plan.endpoint.url + path, parsed.body, headers), None
        engine = _engine_of(plan.prefill.pool, self._registry.snapshot())
        handoff = await PD_PROTOCOLS[engine].run(
            self._client,
            plan.prefill.url,
            plan.endpoint.url,
            path,
            dict(parsed.payload),
            headers,
        )
        return handoff.response, handoff

    async def _release(
        self,
        held: list[Reservation],
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
            await self._state.finish(reservation, outcome)
            if self._admission is not None:
                self._admission.released(reservation.endpoint)

    async def finish(
        self,
        sent: Dispatched,
        parsed: ParsedRequest,
        *,
        succeeded: bool,
        output_tokens: int | None,
        prompt_tokens: int | None,
    ) -> None:
        """Release the request's reservations and teach the state what it learned (nothing, for
        an API that runs no model). A request that ``succeeded`` (the engine's whole answer
        relayed) is a success for its endpoints' circuit breakers: counted at the end, not at
        the response headers, so an engine that answers 200 and then breaks its streams keeps
        counting as failing. A stream that ended before its first token ends its outstanding
        prefill (admission control).

        Runs to its end even if the calling task is cancelled meanwhile (a client that leaves
        as its response ends): in a task of its own (:func:`asyncio.shield`), unless the
        response closes and the state finishes without suspending — then nothing can
        interrupt it, and a task would cost a turn of the event loop per request."""
        at_once = self._state.finishes_at_once and sent.handoff is None and \
            sent.response.closes_at_once
        work = self._finish(sent, parsed, succeeded, output_tokens, prompt_tokens)
        await (work if at_once else asyncio.shield(work))

    async def _finish(self, sent: Dispatched, parsed: ParsedRequest, succeeded: bool,
                      output_tokens: int | None, prompt_tokens: int | None) -> None:
        if sent.handoff is not None:
            await sent.handoff.close()
        else:
            await sent.response.close()
        await self._release(
            sent.reservations,
            sent.features,
            parsed,
            succeeded=succeeded and parsed.api_path not in NO_INFERENCE,
            output_tokens=output_tokens,
            matched_tokens=sent.matched_tokens,
            prompt_tokens=prompt_tokens,
        )
        if succeeded:
            for url in sent.plan.urls:
                self._registry.mark_succeeded(url)
        if sent.prefill_ahead:
            self._prefill_done(sent, None)

    def first_token(self, sent: Dispatched, ttft_s: float) -> None:
        """A streamed request's first token came ``ttft_s`` after the request arrived: its
        part after the wait for a slot (the engine's) teaches admission control the pool's TTFT
        floor and prefill rate, and ends its outstanding prefill."""
        if self._admission is None:
            return
        engine_ttft_s = ttft_s - sent.waited_s
        self._admission.observed_ttft(sent.plan.decision.pool, engine_ttft_s)
        if sent.prefill_ahead:
            self._prefill_done(sent, engine_ttft_s)

    def _prefill_started(self, parsed: ParsedRequest, plan: RoutePlan,
                         features: RequestFeatures) -> int:
        """A streamed request's prefill counted as outstanding from its placement, before it
        is sent (a burst is placed whole before any engine answers): admission control's
        :meth:`~gateway.access.admission.Admission.prefill_started`; 0 when not counted."""
        if self._admission is None or not parsed.stream:
            return 0
        return self._admission.prefill_started(plan.first.url, features.prompt_tokens)

    def _prefill_done(self, sent: Dispatched, engine_ttft_s: float | None) -> None:
        assert self._admission is not None
        self._admission.prefill_done(sent.plan.first.url, sent.features.prompt_tokens,
                                     sent.prefill_ahead, engine_ttft_s)
        sent.prefill_ahead = 0


def _engine_model(parsed: ParsedRequest, names: Mapping[str, str] | None) -> ParsedRequest:
    """``parsed`` with the ``model`` its engine takes for the name the client sent
    (:func:`engine_model_names`), or as it is."""
    name = names.get(parsed.model) if names else None
    if name is None:
        return parsed
    return parsed.with_payload({**parsed.payload, "model": name})


def _index_of(url: str, pools: tuple[PoolSnapshot, ...]) -> int:
    """The endpoint's position in its pool's configured endpoint list."""
    for pool in pools:
        for i, ep in enumerate(pool.endpoints):
            if ep.url == url:
                return i
    return -1


def _engine_of(pool: str, pools: tuple[PoolSnapshot, ...]) -> str:
    for p in pools:
        if p.name == pool:
            return p.engine
    raise KeyError(pool)


def load_router(router: Router) -> Router:
    """``router``'s replica schedulers behind a lever policy without rules: a model's only
    pool, else the least-loaded unsaturated pool serving it (:class:`routing.policy.LeverPolicy`
    with no rule falls through to its last resort), then that pool's scheduler."""
    return Router(LeverPolicy(PolicyConfig(rules=())), router.schedulers)


def as_whole_pools(pools: tuple[PoolSnapshot, ...]) -> tuple[PoolSnapshot, ...]:
    """``pools`` with every prefill and decode pool seen as a mixed one (its engines answer
    what generates nothing directly, without the P/D hand-off)."""
    if all(p.role == MIXED for p in pools):
        return pools
    return tuple(p if p.role == MIXED else p.replaced(role=MIXED, pair=None) for p in pools)

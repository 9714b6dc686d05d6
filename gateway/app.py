"""The app factory: ``create_app(settings, fleet)`` wires settings, registry, poller, upstream
client, telemetry and routes. Everything lives on the app (``app.state.gateway``) and is
created in the lifespan, inside the running event loop; nothing is module-level.

The app served is a :class:`RidgeApp`: the routes an engine answers (generation, and the other
APIs of :data:`~gateway.request.proxy.PROXIED_PATHS`) go straight to the
:class:`~gateway.request.proxy.Proxy`
(the hot path: one dictionary look-up of the path, no FastAPI routing, dependency injection or
middleware), every other request to the FastAPI application (models, version, health,
readiness, metrics, documentation, and the OpenAI-shaped 404s — naming the method and path —
and 405s, with ``Allow``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import MappingProxyType

import aiohttp
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry
from starlette.datastructures import State
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from backends.engines.kv_capacity import engine_cache_tokens
from backends.engines.probe import HeadersFor, HttpProbe, MetricsSource
from backends.engines.tokenizers import fleet_tokenizers
from backends.registry.breaker import BreakerConfig
from backends.registry.endpoints import EndpointRegistry
from backends.registry.poller import Poller
from backends.registry.resolver import DnsResolver
from backends.upstream.aiohttp_transport import AiohttpClient
from backends.upstream.client import BackendClient, Timeouts
from backends.upstream.http1 import Http1Client
from config.fleet import Fleet
from gateway.access.admission import REASONS, Admission, AdmissionConfig
from gateway.access.control import Access, Estimate
from gateway.access.keys import KeyRing, KeysFile, KeySource, RedisKeys
from gateway.access.limits import LocalLimiter, RateLimiter, RedisLimiter
from gateway.fleet.kv_events import KvEventGauges, with_engine_events
from gateway.fleet.reload import Reloader
from gateway.fleet.reload import router as reload_router
from gateway.fleet.views import FleetRegistryView
from gateway.request.dispatch import (
    Dispatcher,
    EngineHeaders,
    ProbeAuth,
    engine_headers,
    engine_model_names,
)
from gateway.request.proxy import PROXIED_PATHS, BodyLimits, Proxy
from gateway.server.errors import GatewayError, error_body, install_error_handlers
from gateway.server.exchange import send_error
from gateway.server.front_door import Door
from gateway.server.openapi import openapi_with_engine_routes
from gateway.server.routes import PAGE_FILES, ridge_version, router
from gateway.server.shutdown import Lifecycle
from gateway.services import Gateway
from gateway.settings import AdmissionSettings, Settings, StateSettings, UpstreamSettings
from gateway.state.redis import RedisState, RedisUnavailable
from gateway.state.shared_memory import WorkerContext, WorkerState
from gateway.telemetry.access_log import AccessLog
from gateway.telemetry.fleet_gauges import CapacityGauges, CircuitGauges
from gateway.telemetry.prometheus import Telemetry
from gateway.telemetry.slos import slo_policy
from gateway.telemetry.state_gauges import StateGauges
from gateway.telemetry.trace import build_recorder
from gateway.workers.merged_metrics import serve_own_page
from routing.admission.capacity import CapacityConfig
from routing.admission.prefill_pace import roofline_prefill_rate
from routing.features import FeatureConfig, FeatureExtractor
from routing.kv_events.state import unwrapped
from routing.policy import LeverPolicy
from routing.prefix_index import BYTES_PER_ENTRY, entries_to_remember_sent
from routing.router import Router
from routing.scheduler.catalog import build_scheduler
from routing.snapshots import PoolSnapshot
from routing.state.memory import MemoryState, StateLimits, StateSizes
from routing.state.protocol import RouterState

log = logging.getLogger("ridge")

Clock = Callable[[], float]
"""Seconds on a monotonic clock."""
ClientFactory = Callable[[UpstreamSettings], BackendClient]
ProbeFactory = Callable[[aiohttp.ClientSession, Http1Client | None, float, HeadersFor],
                        MetricsSource]
"""Makes the registry's probe: the aiohttp session, ridge's own client for ``http://``
engines (None: the session for every one), the probe timeout [s], the headers per endpoint."""

PROBE_CONNECTIONS = 1024
"""Connections the probes' own client may hold open at once (about three per endpoint while
its facts are read)."""


def http_probe(session: aiohttp.ClientSession, lean: Http1Client | None, timeout_s: float,
               headers: HeadersFor) -> MetricsSource:
    """The registry's probe over HTTP (:class:`backends.engines.probe.HttpProbe`)."""
    return HttpProbe(session, timeout_s, headers=headers, lean=lean)


def probe_client(settings: Settings) -> Http1Client | None:
    """ridge's own client for the probes, when the engines' transport is ridge's own (an
    operator who chose aiohttp for the engines' requests gets it for their probes too); its
    timeouts are the probe's."""
    if settings.upstream.transport != "http1":
        return None
    timeout_s = settings.registry.probe_timeout_s
    return Http1Client(Timeouts(connect=timeout_s, first_byte=timeout_s, idle=timeout_s),
                       PROBE_CONNECTIONS)


TRANSPORTS: Mapping[str, Callable[[Timeouts, int], BackendClient]] = MappingProxyType({
    "http1": Http1Client,
    "aiohttp": AiohttpClient,
})


def default_client(upstream: UpstreamSettings) -> BackendClient:
    timeouts = Timeouts(
        connect=upstream.connect_timeout_s,
        first_byte=upstream.first_byte_timeout_s,
        idle=upstream.stream_idle_timeout_s,
    )
    return TRANSPORTS[upstream.transport](timeouts, upstream.max_connections)


def create_app(
    settings: Settings,
    fleet: Fleet,
    *,
    metrics_registry: CollectorRegistry | None = None,
    client_factory: ClientFactory = default_client,
    probe_factory: ProbeFactory = http_probe,
    worker: WorkerContext | None = None,
    lifecycle: Lifecycle | None = None,
    clock: Clock | None = None,
) -> RidgeApp:
    """A ridge app for ``fleet``. The factories are seams for tests; ``worker``: this
    process's place among ``ridge serve --workers N``; ``lifecycle``: set draining by the
    server when it is told to stop (:mod:`gateway.server.shutdown`); ``clock``: the one clock
    [s] every timer, age, rate and latency of the gateway reads (default: each its own
    monotonic clock; a virtual-time loop's ``time`` runs the gateway on virtual time). Raises
    :class:`~config.fleet.FleetConfigError` when a configured tokenizer cannot be loaded
    or a pool's engine API key is not in the environment."""
    parts = _Parts(build_extractor(fleet), metrics_registry or CollectorRegistry(),
                   client_factory, probe_factory, worker, lifecycle or Lifecycle(),
                   engine_headers(fleet, os.environ), clock)

    @asynccontextmanager
    async def lifespan(api: FastAPI) -> AsyncIterator[None]:
        async with _running(api, settings, fleet, parts):
            yield

    docs = settings.api_docs
    api = FastAPI(title="ridge", version=ridge_version(), lifespan=lifespan,
                  docs_url="/docs" if docs else None, redoc_url="/redoc" if docs else None)
    api.openapi = openapi_with_engine_routes(api)  # type: ignore[method-assign]
    install_error_handlers(api)
    api.add_exception_handler(404, _no_route)
    api.add_exception_handler(405, _wrong_method)
    api.include_router(router)
    api.include_router(reload_router)
    return RidgeApp(api, settings.admin_port, settings.cors_origins, parts.running)


ADMIN_PATHS = frozenset({"/metrics", "/status", "/docs", "/docs/oauth2-redirect", "/redoc",
                         "/openapi.json", "/admin/reload"})
"""The operator's routes: on the admin port when there is one, else behind an admin key
whenever keys are required."""
PAGE_PATHS = frozenset(PAGE_FILES)
"""The live page's files: where the admin routes are, with no key (they hold no data; the page
asks for an admin key when ``/status`` needs one)."""
PROBE_PATHS = frozenset({"/health", "/ready"})
"""Routes every listener answers without a key (liveness and readiness probes)."""


class Running:
    """The gateway an app runs, once its lifespan has built it (None until then): what the
    front door reads for every request, past the look-up of the FastAPI state's attributes."""

    __slots__ = ("gateway",)

    def __init__(self) -> None:
        self.gateway: Gateway | None = None


class RidgeApp:
    """The ASGI application ridge serves: ``POST`` to a path of
    :data:`~gateway.request.proxy.PROXIED_PATHS` goes to the running gateway's
    :class:`~gateway.request.proxy.Proxy` (another method there: a 405), anything else to the
    FastAPI
    application ``api``, whose lifespan builds the gateway. ``admin_port``: the
    port of the admin listener (:data:`ADMIN_PATHS` there and nowhere else), or None;
    ``cors_origins``: the origins browsers may call from (:func:`cors`; none: CORS off)."""

    def __init__(self, api: FastAPI, admin_port: int | None = None,
                 cors_origins: Sequence[str] = (), running: Running | None = None) -> None:
        self.api = api
        self._running = running if running is not None else Running()
        self.admin_port = admin_port
        self._entry: ASGIApp = cors(self._route, cors_origins) if cors_origins else self._route
        self._cors = bool(cors_origins)

    def door(self, method: bytes, path: bytes,
             server: tuple[str, int | None] | None) -> Door | None:
        """The front door (:mod:`gateway.server.front_door`) of a ``POST`` to an engine route
        where :meth:`_route` would hand it to the proxy, once the gateway runs; None (the ASGI
        way) for any other request, and for every one when CORS is on."""
        if method != b"POST" or self._cors:
            return None
        gateway = self._running.gateway
        if gateway is None or (self.admin_port is not None and server is not None
                               and server[1] == self.admin_port):
            return None
        return gateway.proxy.doors.get(path)

    @property
    def state(self) -> State:
        """The FastAPI application's state (``state.gateway``: the running gateway)."""
        return self.api.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._entry(scope, receive, send)

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.api(scope, receive, send)
            return
        path = scope["path"]
        api_path = PROXIED_PATHS.get(path)
        if api_path is not None and (self.admin_port is None or not self._on_admin_port(scope)):
            if scope["method"] == "POST":
                await self.api.state.gateway.proxy(scope, receive, send, api_path)
            else:
                await send_error(send, GatewayError(
                    405, f"Method Not Allowed ({scope['method']} {path})",
                    code="method_not_allowed"))
            return
        refused = self._refusal(scope, path)
        if refused is not None:
            await send_error(send, refused)
            return
        await self.api(scope, receive, send)

    def _on_admin_port(self, scope: Scope) -> bool:
        server = scope.get("server")
        return self.admin_port is not None and server is not None and \
            server[1] == self.admin_port

    def _refusal(self, scope: Scope, path: str) -> GatewayError | None:
        """Why a non-generation request is refused here, or None: on the admin listener only
        the admin and probe routes exist; an admin route elsewhere exists only without an
        admin listener, and then needs an admin key when keys are required."""
        if self._on_admin_port(scope):
            return None if path in ADMIN_PATHS or path in PROBE_PATHS or path in PAGE_PATHS \
                else _not_found(scope["method"], path)
        if path in PAGE_PATHS:
            return None if self.admin_port is None else _not_found(scope["method"], path)
        if path not in ADMIN_PATHS:
            return None
        if self.admin_port is not None:
            return _not_found(scope["method"], path)
        access = self.api.state.gateway.access
        if access is None or not access.keys.required:
            return None
        try:
            caller = access.authenticate(_header(scope, b"authorization"))
        except GatewayError as exc:
            return exc
        if caller.record is not None and caller.record.admin:
            return None
        return GatewayError(403, "This key may not read the admin routes (create one with "
                            "`ridge keys add NAME --admin`).", code="permission_denied")


EXPOSED_HEADERS = ("x-request-id", "x-ridge-route", "x-ridge-endpoint", "retry-after",
                   "x-ratelimit-limit-requests", "x-ratelimit-limit-tokens",
                   "x-ratelimit-remaining-requests", "x-ratelimit-remaining-tokens",
                   "x-ratelimit-reset-requests", "x-ratelimit-reset-tokens")
"""Response headers a browser script may read."""


def cors(app: ASGIApp, origins: Sequence[str]) -> ASGIApp:
    """``app`` answering CORS preflights and marking responses for ``origins`` (``*``: any;
    no credentials then, as the CORS rules require): GET and POST, any request header."""
    wildcard = "*" in origins
    return CORSMiddleware(app, allow_origins=list(origins), allow_methods=["GET", "POST"],
                          allow_headers=["*"], allow_credentials=not wildcard,
                          expose_headers=list(EXPOSED_HEADERS), max_age=600)


def _not_found(method: str, path: str) -> GatewayError:
    """OpenAI's answer to a path it does not serve, naming the method and the path."""
    return GatewayError(404, f"Invalid URL ({method} {path})", code="not_found")


async def _no_route(request: Request, exc: Exception) -> JSONResponse:
    """A path no route of ridge's serves (:func:`_not_found`)."""
    return JSONResponse(_not_found(request.method, request.url.path).body(), status_code=404)


async def _wrong_method(request: Request, exc: Exception) -> JSONResponse:
    """A route of ridge's called with another method: a 405 saying which are allowed."""
    headers = exc.headers if isinstance(exc, StarletteHTTPException) else None
    body = error_body(405, f"Method Not Allowed ({request.method} {request.url.path})",
                      code="method_not_allowed")
    return JSONResponse(body, status_code=405, headers=headers)


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


@dataclass(frozen=True)
class _Parts:
    """What :func:`create_app` was given, for the lifespan to build the gateway from."""

    extractor: FeatureExtractor
    metrics_registry: CollectorRegistry
    client_factory: ClientFactory
    probe_factory: ProbeFactory
    worker: WorkerContext | None
    lifecycle: Lifecycle
    engine_headers: EngineHeaders
    clock: Clock | None
    running: Running = field(default_factory=Running)

    def monotonic(self) -> Clock:
        """The clock of the parts that keep ages, rates and timers."""
        return self.clock or time.monotonic


@asynccontextmanager
async def _running(app: FastAPI, settings: Settings, fleet: Fleet,
                   parts: _Parts) -> AsyncIterator[None]:
    registry = EndpointRegistry(fleet, breaker=BreakerConfig(
        settings.registry.breaker_failures, settings.registry.breaker_open_s,
        settings.registry.breaker_max_open_s), drain_timeout_s=settings.registry.drain_timeout_s,
        clock=parts.monotonic())
    telemetry = Telemetry(parts.metrics_registry, frozenset(
        m for p in fleet.pools for m in (*p.models, *p.adapter_names())), clock=parts.monotonic())
    bounds = state_limits(settings.state, fleet)
    state, events = with_engine_events(
        fleet, parts.extractor.config.block_tokens,
        await build_state(settings, telemetry, bounds, parts.worker, parts.monotonic()))
    telemetry.bind_fleet(fleet, registry.snapshot, state, plan=lambda: gateway.fleet.plan)
    telemetry.metrics_registry.register(CircuitGauges(registry))
    telemetry.metrics_registry.register(CapacityGauges(lambda: _capacities(gateway)))
    telemetry.metrics_registry.register(StateGauges(bounds.max_prefix_entries, state_sizes(state)))
    if events is not None:
        telemetry.metrics_registry.register(KvEventGauges(events))
    client = parts.client_factory(settings.upstream)
    probe_session, probe_lean = aiohttp.ClientSession(), probe_client(settings)
    poller = Poller(
        registry,
        parts.probe_factory(probe_session, probe_lean, settings.registry.probe_timeout_s,
                            ProbeAuth(lambda: gateway.fleet, registry.pool_of, os.environ)),
        interval_s=settings.registry.poll_interval_s,
        resolver=DnsResolver(timeout_s=settings.registry.probe_timeout_s),
        in_flight=state.in_flight,
        on_gone=state.forget_endpoint,
    )
    limits = BodyLimits(settings.max_body_bytes, settings.upstream.max_response_bytes,
                        settings.upstream.max_event_bytes)
    access = build_access(settings, fleet, state, parts.worker, parts.monotonic())
    trace = build_recorder(settings.trace, parts.extractor.config.block_tokens,
                           telemetry.metrics_registry, parts.worker.index if parts.worker else None)

    def serving(new: Fleet, headers: EngineHeaders) -> Proxy:
        """The request path for the fleet ``new`` (at start-up, and at each reload)."""
        fleet_view = FleetRegistryView(registry, new)
        admission = build_admission(settings.admission, new, fleet_view.snapshot, telemetry,
                                    parts.monotonic())
        dispatcher = Dispatcher(fleet_view, client, build_router(new), state, parts.extractor,
                                settings.upstream.retries, headers, admission,
                                engine_model_names(new))
        return Proxy(dispatcher, telemetry, access, limits, trace=trace,
                     clock=parts.clock or time.perf_counter,
                     access_log=AccessLog(settings.access_log_format)
                     if settings.access_log else None)

    gateway = Gateway(settings, fleet, registry, telemetry, serving(fleet, parts.engine_headers),
                      state, parts.worker, parts.lifecycle, access)
    app.state.gateway = parts.running.gateway = gateway
    app.state.reloader = reloader = Reloader(gateway, poller, serving, settings.config)
    pages = await _worker_pages(gateway)
    try:
        await access.keys.start()
        if trace is not None:
            trace.start()
        poller.start()
        if events is not None:
            events.start(lambda: gateway.fleet, registry.snapshot)
        reloader.listen()
        if not await poller.wait_until_polled(settings.registry.startup_wait_s):
            log.warning("endpoints not all probed within %.1f s of start-up; serving anyway",
                        settings.registry.startup_wait_s)
        yield
    finally:
        if pages is not None:
            pages.close()
        await reloader.close()
        await access.keys.stop()
        await poller.stop()
        if trace is not None:
            await trace.stop()
        await client.aclose()
        await probe_session.close()
        if probe_lean is not None:
            await probe_lean.aclose()
        if events is not None:
            await events.aclose()
        await state.aclose()


async def _worker_pages(gateway: Gateway) -> asyncio.AbstractServer | None:
    """A worker answers the other workers' scrapes with its own page (its Unix socket)."""
    if gateway.worker is None:
        return None
    return await serve_own_page(gateway.worker.own_page, gateway.own_metrics)


def build_access(settings: Settings, fleet: Fleet, state: RouterState,
                 worker: WorkerContext | None = None, clock: Clock = time.monotonic) -> Access:
    """Keys from the keys file and, with Redis state, Redis; rate limits in Redis with Redis
    state, else in this process (a worker's part: 1/N of each limit; ``clock``: theirs)."""
    sources: list[KeySource] = []
    if settings.keys_file:
        sources.append(KeysFile(settings.keys_file))
    limiter: RateLimiter
    state = unwrapped(state)
    if isinstance(state, RedisState):
        sources.append(RedisKeys(state.client, settings.state.redis_prefix))
        limiter = RedisLimiter(state, settings.state.redis_prefix,
                               settings.state.reservation_ttl_s)
    else:
        limiter = LocalLimiter(clock,
                               share=1.0 / len(worker.pages) if worker else 1.0)
    features = fleet.routing.features
    return Access(KeyRing(sources, settings.auth, settings.keys_refresh_s), limiter,
                  Estimate(features.chars_per_token, features.default_output_tokens),
                  settings.request_timeout_s)


def state_sizes(state: RouterState) -> Callable[[], StateSizes] | None:
    """How to read the sizes of this process's index: a memory state's, a worker's replica's;
    None for a Redis state (its index is in Redis)."""
    state = unwrapped(state)
    if isinstance(state, MemoryState):
        return state.sizes
    if isinstance(state, WorkerState):
        return state.local.sizes
    return None


FALLBACK_PREFIX_ENTRIES = 500_000
"""The prefix index's cap when the fleet file does not give every engine's KV capacity."""
MIN_PREFIX_ENTRIES = 10_000
"""The smallest derived cap (a tiny fleet still keeps its recent prompts)."""


def prefix_index_entries(state: StateSettings, fleet: Fleet) -> int:
    """The prefix index's cap: ``state.max_prefix_entries`` when set, else enough entries for
    every block the fleet's engines can hold, their running requests' included
    (:func:`routing.prefix_index.entries_to_remember_sent`
    over every endpoint's :func:`backends.engines.kv_capacity.engine_cache_tokens`, in the fleet's
    router
    blocks: device KV and host tier), at least :data:`FALLBACK_PREFIX_ENTRIES` when an
    endpoint's capacity is unknown,
    and at most ``state.prefix_index_max_bytes`` of memory."""
    if state.max_prefix_entries is not None:
        return state.max_prefix_entries
    capacities = [engine_cache_tokens(p) for p in fleet.pools for _ in p.endpoints]
    known = [c for c in capacities if c is not None]
    entries = entries_to_remember_sent(known, fleet.routing.features.block_tokens)
    if len(known) < len(capacities):
        entries = max(entries, FALLBACK_PREFIX_ENTRIES)
    return max(MIN_PREFIX_ENTRIES, min(entries, state.prefix_index_max_bytes // BYTES_PER_ENTRY))


def state_limits(state: StateSettings, fleet: Fleet) -> StateLimits:
    """The router state's bounds; logs the prefix index's cap."""
    entries = prefix_index_entries(state, fleet)
    log.info("prefix index: up to %d (block, endpoint) entries, ~%.0f MB%s", entries,
             entries * BYTES_PER_ENTRY / 1e6, "" if state.max_prefix_entries else
             " (derived from the fleet's KV capacity)")
    return StateLimits(
        max_prefix_entries=entries,
        prefix_max_age_s=state.prefix_max_age_s,
        max_sessions=state.max_sessions, session_max_age_s=state.session_max_age_s,
        reservation_ttl_s=state.reservation_ttl_s, max_reservations=state.max_reservations,
        window_requests=state.window_requests, max_models=state.max_models,
    )


async def build_state(settings: Settings, telemetry: Telemetry, limits: StateLimits,
                      worker: WorkerContext | None = None,
                      clock: Clock = time.monotonic) -> RouterState:
    """``RIDGE_REDIS_URL`` set: a :class:`RedisState` (local fallback inside), Redis checked
    once (:meth:`RedisState.start`); else, in a worker of ``ridge serve --workers``, the
    workers' shared :class:`WorkerState`; else memory (on ``clock``: Redis and the
    workers' state keep the time the processes share). Raises
    :class:`~gateway.state.redis.RedisUnavailable` when Redis fails that check and
    ``state.redis_required`` is set."""
    if settings.redis_url is None:
        if worker is not None:
            return WorkerState(worker.region, worker.index, limits)
        return MemoryState(limits, clock)
    gauge = telemetry.state_backend_up.labels("redis")
    state = RedisState.from_url(
        settings.redis_url, limits, prefix=settings.state.redis_prefix,
        timeout_s=settings.state.redis_timeout_s,
        probe_interval_s=settings.state.redis_probe_interval_s,
        max_connections=settings.state.redis_max_connections,
        on_backend=lambda up: gauge.set(1 if up else 0),
    )
    try:
        check = await state.start(required=settings.state.redis_required)
    except RedisUnavailable:
        await state.aclose()
        raise
    if check.ok:
        log.info("router state shared in Redis at %s (prefix %r)", check.where,
                 settings.state.redis_prefix)
    return state


def build_extractor(fleet: Fleet) -> FeatureExtractor:
    """The fleet's feature extraction: block size, estimate, and the exact prompt tokens
    (tokenizer and chat template) of each model that has them, logged once per model."""
    f = fleet.routing.features
    config = FeatureConfig(f.block_tokens, f.chars_per_token, f.default_output_tokens)
    tokenizers = fleet_tokenizers(fleet)
    return FeatureExtractor(config, tokenizers, exact=tokenizers)


def _capacities(gateway: Gateway) -> list[tuple[str, str, int]]:
    """Admission control's endpoint capacities on the gateway's request path now."""
    admission = gateway.proxy.dispatcher.admission
    return admission.capacities() if admission is not None else []


def build_admission(settings: AdmissionSettings, fleet: Fleet,
                    snapshot: Callable[[], tuple[PoolSnapshot, ...]],
                    telemetry: Telemetry | None = None,
                    clock: Clock = time.monotonic) -> Admission | None:
    """Admission control against the fleet's SLOs (None when turned off)."""
    if not settings.enabled:
        return None
    capacity = CapacityConfig(settings.allowance, settings.ceiling_ttl_s)
    config = AdmissionConfig(settings.max_wait_s, settings.max_queue, settings.recheck_s,
                             capacity, settings.prefill_target, settings.wait_deviations,
                             settings.cache_affinity)
    if telemetry is not None:
        telemetry.admission_pools((p.name for p in fleet.pools), REASONS)
    return Admission(config, slo_policy(fleet), snapshot, telemetry, clock,
                     prefill_priors(fleet, settings.prefill_efficiency))


DEFAULT_PREFILL_CHUNK = 2048
"""Prompt tokens per engine step for a pool that declares no chunked-prefill budget (vLLM's
``max_num_batched_tokens`` on a GPU of less than 70 GiB)."""


def prefill_priors(fleet: Fleet, efficiency: float) -> dict[str, float]:
    """Each pool's prior prefill rate [prompt tokens/s] from its model and hardware facts
    (pools without both have none)."""
    out: dict[str, float] = {}
    for pool in fleet.pools:
        if pool.model is None or pool.hardware is None:
            continue
        chunked = pool.levers.chunked_prefill
        chunk = chunked.token_budget if chunked and chunked.enabled else DEFAULT_PREFILL_CHUNK
        out[pool.name] = roofline_prefill_rate(pool.model.to_shape(), pool.hardware.to_rates(),
                                               chunk, efficiency)
    return out


def build_router(fleet: Fleet) -> Router:
    """The fleet's lever policy and one replica scheduler per pool, from its configuration."""
    schedulers = {p.name: build_scheduler(fleet.scheduler_config(p.name)) for p in fleet.pools}
    return Router(LeverPolicy(fleet.policy_config()), schedulers)

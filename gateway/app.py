"""The app factory: ``create_app(settings, fleet)`` wires settings, registry, poller, upstream
client, telemetry and routes. Everything lives on the app (``app.state.gateway``) and is
created in the lifespan, inside the running event loop; nothing is module-level.

The app served is a :class:`RidgeApp`: the generation routes go straight to the
:class:`~gateway.proxy.Proxy` (the hot path: no FastAPI routing, dependency injection or
middleware), every other request to the FastAPI application (models, health, readiness,
metrics, documentation, and the OpenAI-shaped 404s and 405s).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import MappingProxyType

import aiohttp
from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from starlette.datastructures import State
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from backends.aiohttp_client import AiohttpClient
from backends.client import BackendClient, Timeouts
from backends.fleet_file import Fleet, FleetConfigError
from backends.http1_client import Http1Client
from backends.httpx_client import HttpxClient
from backends.probe import HttpProbe, MetricsSource
from backends.registry import BreakerConfig, EndpointRegistry, Poller
from gateway.access import Access, Estimate
from gateway.admission import Admission, AdmissionConfig
from gateway.dispatch import Dispatcher, EngineHeaders, engine_headers
from gateway.errors import GatewayError, install_error_handlers
from gateway.fleet_gauges import CircuitGauges
from gateway.keys import KeyRing, KeysFile, KeySource, RedisKeys
from gateway.proxy import GENERATION_PATHS, BodyLimits, Proxy, send_error
from gateway.rate_limits import LocalLimiter, RateLimiter, RedisLimiter
from gateway.redis_state import RedisState, RedisUnavailable
from gateway.routes import router
from gateway.services import Gateway
from gateway.settings import AdmissionSettings, Settings, StateSettings, UpstreamSettings
from gateway.shutdown import Lifecycle
from gateway.slos import slo_policy
from gateway.telemetry import Telemetry
from gateway.worker_metrics import serve_own_page
from gateway.worker_state import WorkerContext, WorkerState
from routing.admission import CapacityConfig
from routing.features import FeatureConfig, FeatureExtractor
from routing.memory_state import MemoryState, StateLimits
from routing.policy import LeverPolicy
from routing.router import Router
from routing.scheduler.catalog import build_scheduler
from routing.snapshots import PoolSnapshot
from routing.state import RouterState
from routing.token_counters import HFTokenizerCounter, TokenCounter, tokenizers_available

log = logging.getLogger("ridge")

ClientFactory = Callable[[UpstreamSettings], BackendClient]
ProbeFactory = Callable[[aiohttp.ClientSession, float], MetricsSource]

TRANSPORTS: Mapping[str, Callable[[Timeouts, int], BackendClient]] = MappingProxyType({
    "http1": Http1Client,
    "aiohttp": AiohttpClient,
    "httpx": HttpxClient,
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
    probe_factory: ProbeFactory = HttpProbe,
    worker: WorkerContext | None = None,
    lifecycle: Lifecycle | None = None,
) -> RidgeApp:
    """A ridge app for ``fleet``. The factories are seams for tests; ``worker``: this
    process's place among ``ridge serve --workers N``; ``lifecycle``: set draining by the
    server when it is told to stop (:mod:`gateway.shutdown`). Raises
    :class:`~backends.fleet_file.FleetConfigError` when a configured tokenizer cannot be loaded
    or a pool's engine API key is not in the environment."""
    parts = _Parts(build_extractor(fleet), metrics_registry or CollectorRegistry(),
                   client_factory, probe_factory, worker, lifecycle or Lifecycle(),
                   engine_headers(fleet, os.environ))

    @asynccontextmanager
    async def lifespan(api: FastAPI) -> AsyncIterator[None]:
        async with _running(api, settings, fleet, parts):
            yield

    api = FastAPI(title="ridge", version="0.1.0", lifespan=lifespan)
    install_error_handlers(api)
    api.include_router(router)
    return RidgeApp(api, settings.admin_port, settings.cors_origins)


ADMIN_PATHS = frozenset({"/metrics", "/docs", "/docs/oauth2-redirect", "/redoc",
                         "/openapi.json"})
"""The operator's routes: on the admin port when there is one, else behind an admin key
whenever keys are required."""
PROBE_PATHS = frozenset({"/health", "/ready"})
"""Routes every listener answers without a key (liveness and readiness probes)."""


class RidgeApp:
    """The ASGI application ridge serves: ``POST`` to a generation route goes to the running
    gateway's :class:`~gateway.proxy.Proxy`, anything else (other methods there included) to
    the FastAPI application ``api``, whose lifespan builds the gateway. ``admin_port``: the
    port of the admin listener (:data:`ADMIN_PATHS` there and nowhere else), or None;
    ``cors_origins``: the origins browsers may call from (:func:`cors`; none: CORS off)."""

    def __init__(self, api: FastAPI, admin_port: int | None = None,
                 cors_origins: Sequence[str] = ()) -> None:
        self.api = api
        self.admin_port = admin_port
        self._entry: ASGIApp = cors(self._route, cors_origins) if cors_origins else self._route

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
        endpoint = GENERATION_PATHS.get(path)
        if endpoint is not None and (self.admin_port is None or not self._on_admin_port(scope)):
            if scope["method"] == "POST":
                await self.api.state.gateway.proxy(scope, receive, send, endpoint)
            else:
                await send_error(send, GatewayError(405, "Method Not Allowed",
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
            return None if path in ADMIN_PATHS or path in PROBE_PATHS else _not_found()
        if path not in ADMIN_PATHS:
            return None
        if self.admin_port is not None:
            return _not_found()
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


def _not_found() -> GatewayError:
    return GatewayError(404, "Not Found", code="not_found")


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


@dataclass(frozen=True)
class _Parts:
    """What :func:`create_app` was given, for the lifespan to build the gateway from."""

    extractor: FeatureExtractor
    metrics: CollectorRegistry
    client_factory: ClientFactory
    probe_factory: ProbeFactory
    worker: WorkerContext | None
    lifecycle: Lifecycle
    engine_headers: EngineHeaders


@asynccontextmanager
async def _running(app: FastAPI, settings: Settings, fleet: Fleet,
                   parts: _Parts) -> AsyncIterator[None]:
    registry = EndpointRegistry(fleet, breaker=BreakerConfig(
        settings.registry.breaker_failures, settings.registry.breaker_open_s,
        settings.registry.breaker_max_open_s))
    telemetry = Telemetry(parts.metrics, frozenset(m for p in fleet.pools for m in p.models))
    state = await build_state(settings, telemetry, parts.worker)
    telemetry.bind_fleet(fleet, registry.snapshot, state)
    telemetry.registry.register(CircuitGauges(registry))
    client = parts.client_factory(settings.upstream)
    probe_session = aiohttp.ClientSession()
    poller = Poller(
        registry,
        parts.probe_factory(probe_session, settings.registry.probe_timeout_s),
        interval_s=settings.registry.poll_interval_s,
    )
    dispatcher = Dispatcher(registry, client, build_router(fleet), state, parts.extractor,
                            settings.upstream.retries, parts.engine_headers,
                            build_admission(settings.admission, fleet, registry.snapshot,
                                            telemetry))
    limits = BodyLimits(settings.max_body_bytes, settings.upstream.max_response_bytes,
                        settings.upstream.max_event_bytes)
    access = build_access(settings, fleet, state, parts.worker)
    proxy = Proxy(dispatcher, telemetry, access, limits)
    gateway = Gateway(settings, fleet, registry, telemetry, proxy, state, parts.worker,
                      parts.lifecycle, access)
    app.state.gateway = gateway
    pages = await _worker_pages(gateway)
    try:
        await access.keys.start()
        poller.start()
        if not await poller.wait_until_polled(settings.registry.startup_wait_s):
            log.warning("endpoints not all probed within %.1f s of start-up; serving anyway",
                        settings.registry.startup_wait_s)
        yield
    finally:
        if pages is not None:
            pages.close()
        await access.keys.stop()
        await poller.stop()
        await client.aclose()
        await probe_session.close()
        await state.aclose()


async def _worker_pages(gateway: Gateway) -> asyncio.AbstractServer | None:
    """A worker answers the other workers' scrapes with its own page (its Unix socket)."""
    if gateway.worker is None:
        return None
    return await serve_own_page(gateway.worker.own_page, gateway.own_metrics)


def build_access(settings: Settings, fleet: Fleet, state: RouterState,
                 worker: WorkerContext | None = None) -> Access:
    """Keys from the keys file and, with Redis state, Redis; rate limits in Redis with Redis
    state, else in this process (a worker's part: 1/N of each limit)."""
    sources: list[KeySource] = []
    if settings.keys_file:
        sources.append(KeysFile(settings.keys_file))
    limiter: RateLimiter
    if isinstance(state, RedisState):
        sources.append(RedisKeys(state.client, settings.state.redis_prefix))
        limiter = RedisLimiter(state, settings.state.redis_prefix,
                               settings.state.reservation_ttl_s)
    else:
        limiter = LocalLimiter(share=1.0 / len(worker.pages) if worker else 1.0)
    features = fleet.routing.features
    return Access(KeyRing(sources, settings.auth, settings.keys_refresh_s), limiter,
                  Estimate(features.chars_per_token, features.default_output_tokens),
                  settings.request_timeout_s)


def state_limits(state: StateSettings) -> StateLimits:
    return StateLimits(
        max_prefix_entries=state.max_prefix_entries, prefix_max_age_s=state.prefix_max_age_s,
        max_sessions=state.max_sessions, session_max_age_s=state.session_max_age_s,
        reservation_ttl_s=state.reservation_ttl_s, max_reservations=state.max_reservations,
        window_requests=state.window_requests, max_models=state.max_models,
    )


async def build_state(settings: Settings, telemetry: Telemetry,
                      worker: WorkerContext | None = None) -> RouterState:
    """``RIDGE_REDIS_URL`` set: a :class:`RedisState` (local fallback inside), Redis checked
    once (:meth:`RedisState.start`); else, in a worker of ``ridge serve --workers``, the
    workers' shared :class:`WorkerState`; else memory. Raises
    :class:`~gateway.redis_state.RedisUnavailable` when Redis fails that check and
    ``state.redis_required`` is set."""
    limits = state_limits(settings.state)
    if settings.redis_url is None:
        if worker is not None:
            return WorkerState(worker.region, worker.index, limits)
        return MemoryState(limits)
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
    """The fleet's feature extraction: block size, estimate and a tokenizer per model."""
    f = fleet.routing.features
    config = FeatureConfig(f.block_tokens, f.chars_per_token, f.default_output_tokens)
    return FeatureExtractor(config, {m: load_tokenizer(m, p) for m, p in f.tokenizers.items()})


def load_tokenizer(model: str, path: str) -> TokenCounter:
    """The exact token counter of ``model`` from ``tokenizer.json`` at ``path``."""
    where = f"routing.features.tokenizers.{model}"
    if not tokenizers_available():
        raise FleetConfigError(f"{where}: the 'tokenizers' package is not installed "
                               "(pip install 'ridge[tokenizers]')")
    try:
        return HFTokenizerCounter.from_file(path)
    except Exception as exc:  # noqa: BLE001 - the library raises its own exception types
        raise FleetConfigError(f"{where}: cannot load {path}: {exc}") from exc


def build_admission(settings: AdmissionSettings, fleet: Fleet,
                    snapshot: Callable[[], tuple[PoolSnapshot, ...]],
                    telemetry: Telemetry | None = None) -> Admission | None:
    """Admission control against the fleet's SLOs (None when turned off)."""
    if not settings.enabled:
        return None
    capacity = CapacityConfig(settings.allowance, settings.ceiling_ttl_s)
    config = AdmissionConfig(settings.max_wait_s, settings.max_queue, settings.recheck_s,
                             capacity)
    return Admission(config, slo_policy(fleet), snapshot, telemetry)


def build_router(fleet: Fleet) -> Router:
    """The fleet's lever policy and one replica scheduler per pool, from its configuration."""
    schedulers = {p.name: build_scheduler(fleet.scheduler_config(p.name)) for p in fleet.pools}
    return Router(LeverPolicy(fleet.policy_config()), schedulers)

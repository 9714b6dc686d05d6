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
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import MappingProxyType

import aiohttp
from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from starlette.datastructures import State
from starlette.types import Receive, Scope, Send

from backends.aiohttp_client import AiohttpClient
from backends.client import BackendClient, Timeouts
from backends.fleet_file import Fleet, FleetConfigError
from backends.http1_client import Http1Client
from backends.httpx_client import HttpxClient
from backends.probe import HttpProbe, MetricsSource
from backends.registry import EndpointRegistry, Poller
from gateway.dispatch import Dispatcher
from gateway.errors import GatewayError, install_error_handlers
from gateway.proxy import GENERATION_PATHS, BodyLimits, Proxy, send_error
from gateway.redis_state import RedisState
from gateway.routes import router
from gateway.services import Gateway
from gateway.settings import Settings, StateSettings, UpstreamSettings
from gateway.shutdown import Lifecycle
from gateway.telemetry import Telemetry
from gateway.worker_metrics import serve_own_page
from gateway.worker_state import WorkerContext, WorkerState
from routing.features import FeatureConfig, FeatureExtractor
from routing.memory_state import MemoryState, StateLimits
from routing.policy import LeverPolicy
from routing.router import Router
from routing.scheduler.catalog import build_scheduler
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
    :class:`~backends.fleet_file.FleetConfigError` when a configured tokenizer cannot be loaded."""
    parts = _Parts(build_extractor(fleet), metrics_registry or CollectorRegistry(),
                   client_factory, probe_factory, worker, lifecycle or Lifecycle())

    @asynccontextmanager
    async def lifespan(api: FastAPI) -> AsyncIterator[None]:
        async with _running(api, settings, fleet, parts):
            yield

    api = FastAPI(title="ridge", version="0.1.0", lifespan=lifespan)
    install_error_handlers(api)
    api.include_router(router)
    return RidgeApp(api)


class RidgeApp:
    """The ASGI application ridge serves: ``POST`` to a generation route goes to the running
    gateway's :class:`~gateway.proxy.Proxy`, anything else (other methods there included) to
    the FastAPI application ``api``, whose lifespan builds the gateway."""

    def __init__(self, api: FastAPI) -> None:
        self.api = api

    @property
    def state(self) -> State:
        """The FastAPI application's state (``state.gateway``: the running gateway)."""
        return self.api.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = GENERATION_PATHS.get(scope["path"]) if scope["type"] == "http" else None
        if endpoint is None:
            await self.api(scope, receive, send)
        elif scope["method"] == "POST":
            await self.api.state.gateway.proxy(scope, receive, send, endpoint)
        else:
            await send_error(send, GatewayError(405, "Method Not Allowed",
                                                code="method_not_allowed"))


@dataclass(frozen=True)
class _Parts:
    """What :func:`create_app` was given, for the lifespan to build the gateway from."""

    extractor: FeatureExtractor
    metrics: CollectorRegistry
    client_factory: ClientFactory
    probe_factory: ProbeFactory
    worker: WorkerContext | None
    lifecycle: Lifecycle


@asynccontextmanager
async def _running(app: FastAPI, settings: Settings, fleet: Fleet,
                   parts: _Parts) -> AsyncIterator[None]:
    registry = EndpointRegistry(fleet)
    telemetry = Telemetry(parts.metrics, frozenset(m for p in fleet.pools for m in p.models))
    state = await build_state(settings, telemetry, parts.worker)
    telemetry.bind_fleet(fleet, registry.snapshot, state)
    client = parts.client_factory(settings.upstream)
    probe_session = aiohttp.ClientSession()
    poller = Poller(
        registry,
        parts.probe_factory(probe_session, settings.registry.probe_timeout_s),
        interval_s=settings.registry.poll_interval_s,
    )
    dispatcher = Dispatcher(registry, client, build_router(fleet), state, parts.extractor,
                            settings.upstream.retries)
    limits = BodyLimits(settings.max_body_bytes, settings.upstream.max_response_bytes,
                        settings.upstream.max_event_bytes)
    proxy = Proxy(dispatcher, telemetry, limits)
    gateway = Gateway(settings, fleet, registry, telemetry, proxy, state, parts.worker,
                      parts.lifecycle)
    app.state.gateway = gateway
    pages = await _worker_pages(gateway)
    try:
        poller.start()
        if not await poller.wait_until_polled(settings.registry.startup_wait_s):
            log.warning("endpoints not all probed within %.1f s of start-up; serving anyway",
                        settings.registry.startup_wait_s)
        yield
    finally:
        if pages is not None:
            pages.close()
        await poller.stop()
        await client.aclose()
        await probe_session.close()
        await state.aclose()


async def _worker_pages(gateway: Gateway) -> asyncio.AbstractServer | None:
    """A worker answers the other workers' scrapes with its own page (its Unix socket)."""
    if gateway.worker is None:
        return None
    return await serve_own_page(gateway.worker.own_page, gateway.own_metrics)


def state_limits(state: StateSettings) -> StateLimits:
    return StateLimits(
        max_prefix_entries=state.max_prefix_entries, prefix_max_age_s=state.prefix_max_age_s,
        max_sessions=state.max_sessions, session_max_age_s=state.session_max_age_s,
        reservation_ttl_s=state.reservation_ttl_s, max_reservations=state.max_reservations,
        window_requests=state.window_requests, max_models=state.max_models,
    )


async def build_state(settings: Settings, telemetry: Telemetry,
                      worker: WorkerContext | None = None) -> RouterState:
    """``RIDGE_REDIS_URL`` set: a :class:`RedisState` (local fallback inside); else, in a
    worker of ``ridge serve --workers``, the workers' shared :class:`WorkerState`; else
    memory."""
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
    await state.start()
    log.info("router state shared in Redis (prefix %r)", settings.state.redis_prefix)
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


def build_router(fleet: Fleet) -> Router:
    """The fleet's lever policy and one replica scheduler per pool, from its configuration."""
    schedulers = {p.name: build_scheduler(fleet.scheduler_config(p.name)) for p in fleet.pools}
    return Router(LeverPolicy(fleet.policy_config()), schedulers)

"""ridge's settings: one pydantic-settings object, env prefix ``RIDGE_``, ``__`` for nesting.

Example: ``RIDGE_PORT=9000``, ``RIDGE_UPSTREAM__CONNECT_TIMEOUT_S=1``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class UpstreamSettings(BaseModel):
    """How ridge talks to engines. Times in seconds."""

    transport: Literal["http1", "aiohttp"] = Field(
        default="http1", description="upstream HTTP transport: ridge's own HTTP/1.1 client "
        "(backends/upstream/http1.py), or aiohttp's; the overhead benchmark measures both"
    )
    connect_timeout_s: float = Field(default=3.0, gt=0)
    first_byte_timeout_s: float = Field(
        default=300.0, gt=0, description="time allowed until the engine's response headers"
    )
    stream_idle_timeout_s: float = Field(
        default=120.0, gt=0, description="longest silence allowed between two streamed chunks"
    )
    max_connections: int = Field(default=1024, gt=0, description="shared pool, all endpoints")
    retries: int = Field(
        default=1, ge=0, description="retries on another endpoint when refused before first "
        "byte (or overloaded: 503)"
    )
    max_response_bytes: int = Field(
        default=64 * 1024 * 1024, gt=0, description="an engine's whole (non-streamed) answer; "
        "past it, 502 and the endpoint counted as failing")
    max_event_bytes: int = Field(
        default=4 * 1024 * 1024, gt=0, description="one event of an engine's stream; past it, "
        "the stream ends with an error event and the endpoint is counted as failing")


class HttpSettings(BaseModel):
    """What one client connection may send (:class:`gateway.server.protocol.HttpLimits`, same
    names). Sizes in bytes, times in seconds."""

    max_header_bytes: int = Field(default=64 * 1024, gt=0,
                                  description="request line + headers; past it, 431")
    max_header_count: int = Field(default=100, gt=0, description="past it, 431")
    header_timeout_s: float = Field(
        default=30.0, gt=0, description="a request's head must arrive within this of the "
        "connection opening or the request's first byte; past it, 408 (a connection that "
        "never sends a byte is closed)")
    body_timeout_s: float = Field(
        default=60.0, gt=0, description="longest silence while a request body arrives; past "
        "it, 408")


class RegistrySettings(BaseModel):
    """The endpoint poller and the endpoints' circuit breakers
    (:class:`backends.registry.breaker.BreakerConfig`). Times in seconds."""

    poll_interval_s: float = Field(default=1.0, gt=0)
    probe_timeout_s: float = Field(default=2.0, gt=0)
    startup_wait_s: float = Field(
        default=5.0, ge=0, description="how long start-up waits for the first poll"
    )
    breaker_failures: int = Field(
        default=3, ge=1, description="consecutive failed requests to an endpoint that open its "
        "circuit breaker (unhealthy whatever its health probe says)"
    )
    breaker_open_s: float = Field(
        default=5.0, gt=0, description="how long a breaker first stays open; then a passing "
        "health probe lets requests in again and the first one's outcome closes or reopens it"
    )
    breaker_max_open_s: float = Field(
        default=60.0, gt=0, description="the open time doubles at each reopening up to this"
    )
    drain_timeout_s: float = Field(
        default=300.0, ge=0, description="an endpoint that left its pool (a fleet reload, or a "
        "`resolve: dns` name that no longer resolves to it) gets no new request and leaves the "
        "registry and the metrics once none of this gateway's requests is in flight there, or "
        "after this long whatever is still in flight (those requests go on)"
    )


class StateSettings(BaseModel):
    """The router state's bounds (:class:`routing.state.memory.StateLimits`, same names) and
    the shared (Redis) state's connection. Sizes are entries; times in seconds."""

    max_prefix_entries: int | None = Field(
        default=None, gt=0, description="the prefix index's cap [(block, endpoint) pairs; "
        "past a prompt's 16th block one entry stands for 4]; "
        "unset: enough to remember every block the fleet's engines can hold (from the pools' "
        "model and hardware facts), within prefix_index_max_bytes"
    )
    prefix_index_max_bytes: int = Field(
        default=1 << 30, gt=0, description="[B] the memory the derived prefix index cap may "
        "take (routing.prefix_index.BYTES_PER_ENTRY per entry)"
    )
    prefix_max_age_s: float = Field(default=600.0, gt=0)
    max_sessions: int = Field(default=100_000, gt=0)
    session_max_age_s: float = Field(default=1800.0, gt=0)
    reservation_ttl_s: float = Field(
        default=900.0, gt=0, description="must exceed the longest request (first-byte timeout)"
    )
    max_reservations: int = Field(default=100_000, gt=0)
    window_requests: int = Field(default=1000, gt=0)
    max_models: int = Field(default=64, gt=0)
    redis_prefix: str = Field(default="ridge:", description="prefix of every Redis key")
    redis_timeout_s: float = Field(
        default=0.25, gt=0, description="deadline of one Redis call (event-loop lag included); "
        "past it, local state"
    )
    redis_probe_interval_s: float = Field(default=1.0, gt=0)
    redis_max_connections: int = Field(default=128, gt=0)
    redis_required: bool = Field(
        default=False, description="with a Redis URL set: when Redis fails the start-up check "
        "(unreachable, credentials refused, any other error), refuse to start (`ridge serve` "
        "exits with status 2) instead of serving with local state until Redis answers"
    )


class AdmissionSettings(BaseModel):
    """Admission control (:mod:`gateway.access.admission`): a request no endpoint has room for waits
    at the gateway for a slot, fair across keys, for at most its TTFT SLO minus the pool's
    measured TTFT floor, or is refused at once (503, ``Retry-After``) when it would wait
    longer. Times in seconds."""

    enabled: bool = Field(default=True, description="off: every request goes to the engines, "
                          "whose queues then hold what they cannot run")
    max_wait_s: float = Field(
        default=10.0, gt=0, description="the wait budget of a model without a TTFT SLO, and "
        "the longest any request waits for a slot")
    max_queue: int = Field(default=256, gt=0, description="requests waiting per pool; past "
                           "it a request is refused at once")
    recheck_s: float = Field(
        default=0.025, gt=0, description="how often the first request in a pool's queue looks "
        "for room freed by other gateways sharing the state (room freed here wakes it at once)")
    allowance: int = Field(
        default=0, ge=0, description="requests an endpoint may hold beyond its learned "
        "capacity before it counts as full")
    ceiling_ttl_s: float = Field(
        default=60.0, gt=0, description="a capacity learned from an engine's queue is "
        "forgotten after this, and learned again")
    prefill_target: float = Field(
        default=0.5, ge=0, le=1, description="prefill pacing: an endpoint is given no more "
        "prompt than it clears, at its measured prefill rate, within this fraction of the TTFT "
        "SLO before its earlier prompts' first tokens (0: off)")
    prefill_efficiency: float = Field(
        default=0.5, gt=0, le=1, description="prefill pacing before a pool's rate is "
        "measured: the share of its roofline prefill rate (its model and hardware facts) its "
        "engines are taken to reach, so a cold burst is paced from the first request")
    wait_deviations: float = Field(
        default=2.0, ge=0, description="a request waits for a slot only when its expected wait "
        "plus this many standard deviations (slots freeing at random) is within its budget")
    cache_affinity: float = Field(
        default=0.5, ge=0, le=1, description="a request whose prompt a full or paced endpoint "
        "holds at least this fraction of (the prefix index's match; with KV events, the larger "
        "of the engine's match and the blocks sent there) is sent there anyway, to "
        "wait in that engine's queue rather than be recomputed elsewhere (0: never)")



class TraceSettings(BaseModel):
    """Traffic recording (:mod:`gateway.telemetry.trace`): every request served, as a line of a
    Mooncake-format trace (arrival, prompt and output tokens, prompt block hash ids; no text).
    Off unless ``path`` is set. Sizes in bytes, times in seconds."""

    path: str | None = Field(default=None, description="the trace file (JSONL); with "
                             "`workers` > 1, one per worker (`trace.w1.jsonl`); unset: off")
    max_bytes: int = Field(default=64 * 1024 * 1024, gt=0,
                           description="past it the file is rotated (`.1`, `.2` …)")
    max_files: int = Field(default=5, ge=1, description="files kept, the current one included")
    block_tokens: int = Field(default=512, gt=0, description="prompt tokens per hash id "
                              "(Mooncake's traces: 512); rounded to whole router blocks")
    queue_size: int = Field(default=10_000, gt=0, description="finished requests waiting to "
                            "be written; past it they are dropped (ridge_trace_dropped_total)")
    flush_interval_s: float = Field(default=1.0, gt=0, description="how often the queue is "
                                    "written out")
    max_ids: int = Field(default=1_000_000, gt=0, description="distinct hash ids in one file "
                         "(the id map's memory bound); past it the file is rotated")

class Settings(BaseSettings):
    """Everything ridge reads from its environment (and the command line)."""

    model_config = SettingsConfigDict(env_prefix="RIDGE_", env_nested_delimiter="__")

    config: str | None = Field(default=None, description="path of the fleet YAML file")
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    workers: int = Field(default=1, ge=1, le=256, description="worker processes of "
                         "`ridge serve` on its one port, routing as one gateway")
    log_level: str = "info"
    access_log: bool = Field(default=False, description="one log line per request (costs CPU)")
    access_log_format: Literal["text", "json"] = Field(
        default="text", description="the access line: `name=value` pairs, or one JSON object")
    metrics_created: bool = Field(
        default=False, description="serve the `_created` series of counters and histograms "
        "on /metrics (when each series was made; nothing ridge ships reads them)")
    keep_alive_s: float = Field(
        default=75.0, gt=0, description="how long an idle client connection stays open [s]; "
        "longer than clients' own pool expiry (httpx 5 s, aiohttp 15 s), so a client never "
        "reuses a connection the gateway is closing at that moment")
    http: HttpSettings = HttpSettings()
    drain_s: float = Field(
        default=5.0, ge=0, description="after SIGTERM, how long /ready answers 503 while "
        "requests are still served, before the listener closes [s]")
    shutdown_timeout_s: float = Field(
        default=30.0, gt=0, description="then how long requests in flight may take before "
        "they are cut [s]")
    auth: Literal["auto", "on", "off"] = Field(
        default="auto", description="API keys: `auto` requires a key as soon as one is "
        "configured (keys file or Redis), `on` always (no key configured: every request is "
        "refused), `off` never")
    keys_file: str | None = Field(
        default=None, description="the keys file `ridge keys` manages (JSON, digests only)")
    keys_refresh_s: float = Field(
        default=2.0, gt=0, description="how often the keys are reloaded from the keys file "
        "and Redis: a key added or revoked takes effect within this [s]")
    request_timeout_s: float | None = Field(
        default=None, gt=0, description="end-to-end deadline of a generation request [s] "
        "(a key's own `timeout_s` wins); unset: none beyond the upstream timeouts")
    api_docs: bool = Field(
        default=False, description="serve the interactive API documentation at /docs and "
        "/redoc (admin routes; their pages load Swagger UI and ReDoc from a CDN, so the "
        "browser needs the internet); /openapi.json is served either way")
    admin_port: int | None = Field(
        default=None, ge=0, le=65535, description="serve /metrics and the API documentation "
        "on this port only (same host); unset: on the main port, behind an admin key when "
        "keys are required")
    cors_origins: list[str] = Field(
        default_factory=list, description="origins browsers may call ridge from (CORS), "
        'e.g. ["https://app.example.com"] or ["*"]; empty: CORS off')
    upstream: UpstreamSettings = UpstreamSettings()
    registry: RegistrySettings = RegistrySettings()
    redis_url: str | None = Field(
        default=None, description="share the router state in Redis (e.g. redis://host:6379/0); "
        "unset: in-memory state, one gateway"
    )
    state: StateSettings = StateSettings()
    admission: AdmissionSettings = AdmissionSettings()
    trace: TraceSettings = TraceSettings()

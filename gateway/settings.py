"""ridge's settings: one pydantic-settings object, env prefix ``RIDGE_``, ``__`` for nesting.

Example: ``RIDGE_PORT=9000``, ``RIDGE_UPSTREAM__CONNECT_TIMEOUT_S=1``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class UpstreamSettings(BaseModel):
    """How ridge talks to engines. Times in seconds."""

    transport: Literal["aiohttp", "httpx"] = Field(
        default="aiohttp", description="upstream HTTP transport; aiohttp measured fastest"
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
        default=1, ge=0, description="retries on another endpoint when refused before first byte"
    )


class RegistrySettings(BaseModel):
    """The endpoint poller. Times in seconds."""

    poll_interval_s: float = Field(default=1.0, gt=0)
    probe_timeout_s: float = Field(default=2.0, gt=0)
    startup_wait_s: float = Field(
        default=5.0, ge=0, description="how long start-up waits for the first poll"
    )


class Settings(BaseSettings):
    """Everything ridge reads from its environment (and the command line)."""

    model_config = SettingsConfigDict(env_prefix="RIDGE_", env_nested_delimiter="__")

    config: str | None = Field(default=None, description="path of the fleet YAML file")
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    log_level: str = "info"
    access_log: bool = Field(default=False, description="one log line per request (costs CPU)")
    upstream: UpstreamSettings = UpstreamSettings()
    registry: RegistrySettings = RegistrySettings()

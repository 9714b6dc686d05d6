"""The Redis state's answers as views, the pending overlay, outages, and the start-up check's
classification with fakes (the rest of the contract runs against a real redis-server in
tests/integration/test_redis_state.py; the start-up check against one in
tests/integration/test_redis_startup.py)."""

from __future__ import annotations

import logging
import socket
from collections import Counter
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import AuthenticationError, InvalidResponse, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.state.redis import (
    SLOW_LIMIT,
    RedisCheck,
    RedisState,
    RedisUnavailable,
    check_redis,
    classify,
    output_mean,
    redis_address,
    view_of,
)
from routing.load import LoadCounts
from routing.prefix_index import KeyLayout
from routing.state.protocol import StateView


def test_a_read_answer_is_a_view() -> None:
    raw: dict[str, Any] = {"m": {"http://a": 3, "http://b": 18}, "l": {"http://a": [2, 700]},
                           "w": [1000, 250, 300, 4], "s": "http://a"}
    # matches come in keys: of a 40-block chain, key 18 is past the 16 dense blocks (16 + 2 × 4)
    assert view_of(raw, KeyLayout(), 40) == StateView(
        {"http://a": 3, "http://b": 24}, {"http://a": LoadCounts(2, 700)}, 0.25, "http://a")
    assert output_mean(raw) == 75.0


def test_empty_tables_from_cjson_and_no_window_mean_unknown() -> None:
    raw: dict[str, Any] = {"m": [], "l": [], "w": [0, 0, 0, 0], "s": False}
    assert view_of(raw, KeyLayout(), 0) == StateView()
    assert output_mean(raw) is None


async def test_the_choice_sees_this_gateways_reservations_still_on_their_way() -> None:
    state = RedisState(Redis())  # never connected: only the overlay is exercised
    view = StateView(load={"http://a": LoadCounts(1, 10)})
    assert state._with_pending(view) is view
    state._pending = Counter({"http://a": 2, "http://b": 1})
    seen = state._with_pending(view)
    assert seen.load_of("http://a") == LoadCounts(3, 10)
    assert seen.load_of("http://b") == LoadCounts(1, 0)
    await state.aclose()


class Script:
    """Stands in for the registered Lua script: answers as ``plan`` says, one item a call."""

    def __init__(self, plan: list[str]) -> None:
        self.plan = plan

    async def __call__(self, args: list[str]) -> str:
        step = self.plan.pop(0)
        if step == "slow":
            raise TimeoutError
        if step == "refused":
            raise ConnectionRefusedError("connection refused")
        return '{"ok": true}'


async def test_slow_answers_in_a_row_are_an_outage_and_one_alone_is_not() -> None:
    seen: list[bool] = []
    state = RedisState(Redis(), on_backend=seen.append, probe_interval_s=3600)
    state._script = Script(["slow", "slow", "ok", "slow", "slow", "slow"])  # type: ignore[assignment]
    answers = [await state._call({"op": "read"}) for _ in range(5)]
    assert answers == [None, None, {"ok": True}, None, None] and seen == [True]  # still up
    assert await state._call({"op": "read"}) is None and seen == [True, False]  # the third
    assert await state._call({"op": "read"}) is None  # down: not even tried
    await state.aclose()


async def test_an_error_is_an_outage_at_once() -> None:
    seen: list[bool] = []
    state = RedisState(Redis(), on_backend=seen.append, probe_interval_s=3600)
    state._script = Script(["refused"])  # type: ignore[assignment]
    assert await state._call({"op": "read"}) is None and seen == [True, False]
    await state.aclose()


# --- the start-up check ------------------------------------------------------------------

def _from(error: BaseException, cause: BaseException) -> BaseException:
    """``error`` raised while handling ``cause``, as redis-py wraps a socket's error."""
    error.__context__ = cause
    return error


@pytest.mark.parametrize(("error", "password", "cause"), [
    (AuthenticationError("invalid username-password pair or user is disabled."), "pw",
     "wrong password or user"),
    (AuthenticationError("HELLO must be called with the client already authenticated"), None,
     "no password given; it requires one"),
    (AuthenticationError("Authentication required."), None, "no password given; it requires one"),
    (ResponseError("WRONGPASS invalid username-password pair"), "pw", "wrong password or user"),
    (ResponseError("NOAUTH Authentication required."), None, "no password given; it requires one"),
])
def test_refused_credentials(error: BaseException, password: str | None, cause: str) -> None:
    assert classify(error, password=password) == RedisCheck("", "auth", cause)


@pytest.mark.parametrize(("error", "cause"), [
    (_from(RedisConnectionError("Error 111 connecting to h:1."), ConnectionRefusedError(111, "x")),
     "connection refused"),
    (ConnectionRefusedError(111, "Connect call failed"), "connection refused"),
    (_from(RedisConnectionError("Error -2 connecting to nowhere:1."),
           socket.gaierror(-2, "Name or service not known")), "host name not resolved"),
    (TimeoutError(), "no answer within 0.5 s, 3 tries"),
    (RedisTimeoutError("Timeout connecting to server"), "no answer within 0.5 s, 3 tries"),
    (_from(RedisConnectionError("Error 101 connecting"), OSError(101, "Network is unreachable")),
     "network is unreachable"),
    (RedisConnectionError("Connection closed by server."), "Connection closed by server."),
])
def test_unreachable(error: BaseException, cause: str) -> None:
    assert classify(error, timeout_s=0.5) == RedisCheck("", "unreachable", cause)


def test_other_errors_keep_their_type_and_text_without_the_password() -> None:
    assert classify(ResponseError("DB index is out of range")) == RedisCheck(
        "", "error", "ResponseError: DB index is out of range")
    leaky = classify(InvalidResponse("Protocol Error: hunter2"), password="hunter2")
    assert leaky == RedisCheck("", "error", "InvalidResponse: Protocol Error: ***")


def test_the_lines_name_redis_by_address_and_say_what_ridge_does() -> None:
    auth = RedisCheck("10.0.0.5:6390/0", "auth", "wrong password or user")
    assert auth.serving_line() == ("Redis at 10.0.0.5:6390/0 refused the credentials (wrong "
                                   "password or user); serving with local state until it "
                                   "accepts them")
    assert auth.level == logging.ERROR
    down = RedisCheck("h:6379/0", "unreachable", "connection refused")
    assert down.serving_line() == ("Redis at h:6379/0 unreachable (connection refused); serving "
                                   "with local state until it answers")
    assert down.level == logging.WARNING
    assert str(down.refusal()) == ("Redis at h:6379/0 unreachable (connection refused); "
                                   "RIDGE_STATE__REDIS_REQUIRED is set, so ridge does not start "
                                   "without it")
    assert RedisCheck("h:6379/0", "ok").ok and not down.ok


@pytest.mark.parametrize(("client", "where"), [
    (Redis(host="10.0.0.5", port=6390, db=2, password="secret"), "10.0.0.5:6390/2"),
    (Redis.from_url("redis://user:secret@cache.internal:7000/3"), "cache.internal:7000/3"),
    (Redis.from_url("redis://[::1]:6379/0"), "[::1]:6379/0"),
    (Redis(unix_socket_path="/run/redis.sock"), "unix:/run/redis.sock/0"),
])
def test_the_address_never_carries_credentials(client: Redis, where: str) -> None:
    assert redis_address(client) == where


class Pings:
    """Stands in for ``Redis.ping``: raises the items of ``plan`` in turn (None: answers)."""

    def __init__(self, *plan: BaseException | None) -> None:
        self.plan, self.calls = list(plan), 0

    async def __call__(self) -> bool:
        self.calls += 1
        step = self.plan.pop(0)
        if step is not None:
            raise step
        return True


async def test_a_late_answer_is_tried_again_and_three_in_a_row_are_unreachable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    client = Redis(host="h", port=1)
    monkeypatch.setattr(client, "ping", Pings(TimeoutError(), TimeoutError(), None))
    assert await check_redis(client, 0.25) == RedisCheck("h:1/0", "ok")
    monkeypatch.setattr(client, "ping", pings := Pings(*[TimeoutError()] * SLOW_LIMIT))
    check = await check_redis(client, 0.25)
    assert (check.outcome, pings.calls) == ("unreachable", SLOW_LIMIT)
    monkeypatch.setattr(client, "ping", pings := Pings(AuthenticationError("x"), None))
    assert (await check_redis(client, 0.25)).outcome == "auth" and pings.calls == 1
    await client.aclose()


async def test_a_failed_start_logs_one_line_without_the_password_and_serves_locally(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    seen: list[bool] = []
    state = RedisState(Redis(host="h", port=1, password="hunter2"), on_backend=seen.append,
                       probe_interval_s=3600)
    monkeypatch.setattr(state._client, "ping", Pings(AuthenticationError("WRONGPASS")))
    with caplog.at_level(logging.INFO, logger="ridge.state"):
        check = await state.start()
    assert check.outcome == "auth" and not state.up and seen == [True, False]
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [(logging.ERROR, (
        "Redis at h:1/0 refused the credentials (wrong password or user); serving with local "
        "state until it accepts them"))]
    assert "hunter2" not in caplog.text
    await state.aclose()


async def test_a_required_redis_that_fails_the_check_stops_the_start(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    state = RedisState(Redis(host="h", port=1), probe_interval_s=3600)
    refused = _from(RedisConnectionError("Error 111"), ConnectionRefusedError(111, "refused"))
    monkeypatch.setattr(state._client, "ping", Pings(refused))
    with pytest.raises(RedisUnavailable, match=r"^Redis at h:1/0 unreachable \(connection "
                       r"refused\); RIDGE_STATE__REDIS_REQUIRED is set"):
        await state.start(required=True)
    assert state.up and not caplog.records  # nothing started, nothing logged: the caller says it
    await state.aclose()

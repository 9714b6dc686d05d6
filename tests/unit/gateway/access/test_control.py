"""Access: a grant settled to its end, in the request's task when nothing can interrupt it."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from gateway.access.control import Access, Estimate
from gateway.access.keys import KeyLimits, KeyRecord, KeyRing, make_record, new_key
from gateway.access.limits import Grant, LocalLimiter
from gateway.request.body import ApiPath, parse_request
from tests.fakes.harness import ends_without_suspending


class GatedLimiter(LocalLimiter):
    """A limiter whose shared grants settle over the network: after ``gate`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.gate = asyncio.Event(), asyncio.Event()
        self.settled: list[Grant] = []

    async def settle(self, grant: Grant, used_tokens: int | None) -> None:
        if grant.shared:
            self.entered.set()
            await self.gate.wait()
        self.settled.append(grant)
        await super().settle(grant, used_tokens)


def record() -> KeyRecord:
    return make_record(new_key(), "k", limits=KeyLimits(max_concurrent=1))


async def test_a_grant_taken_in_this_process_settles_in_the_requests_task() -> None:
    limiter = GatedLimiter()
    access = Access(KeyRing(()), limiter)
    grant = limiter.admit_now(record(), 10)
    assert ends_without_suspending(access.settle(grant, 4))
    assert limiter.settled == [grant]


async def test_a_shared_grant_is_settled_even_when_the_requests_task_is_cancelled() -> None:
    limiter = GatedLimiter()
    access = Access(KeyRing(()), limiter)
    grant = replace(limiter.admit_now(record(), 10), shared=True)
    settling = asyncio.ensure_future(access.settle(grant, 4))
    await limiter.entered.wait()
    settling.cancel()
    with pytest.raises(asyncio.CancelledError):
        await settling
    limiter.gate.set()
    for _ in range(100):  # the shielded settle goes on: a few turns of the loop
        if limiter.settled:
            break
        await asyncio.sleep(0)
    assert limiter.settled == [grant]


def test_the_charge_is_the_prompt_estimate_rounded_up_plus_the_output() -> None:
    body = b'{"model": "m", "prompt": "x"}'  # 29 characters: ⌈29 / 4⌉ = 8 tokens (not 7)
    access = Access(KeyRing(()), LocalLimiter(), Estimate(default_output_tokens=100))
    assert access.charge(parse_request(ApiPath.COMPLETIONS, body)) == 8 + 100
    with_max = parse_request(ApiPath.COMPLETIONS, body[:-1] + b', "max_tokens": 3}')
    assert access.charge(with_max) == 12 + 3  # 46 characters: ⌈46 / 4⌉ = 12

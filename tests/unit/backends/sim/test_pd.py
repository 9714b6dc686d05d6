"""Prefill/decode disaggregation: transfer time, KV held and released, both protocols."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from backends.sim.clock import VirtualClock
from backends.sim.endpoint import SimEndpoint
from backends.sim.openai_api import ApiError
from backends.sim.request import Phase, RemoteKV
from backends.sim.virtual import simulate
from routing.formulas import SeqWork
from tests.unit.backends.sim.sim_helpers import make_core, make_pool, make_request

LINK = 10e9  # B/s


def test_decode_engine_waits_for_the_transfer_then_decodes() -> None:
    pool = make_pool(model="llama-3-8b", hardware="a100-80gb", role="decode")
    core = make_core(pool)
    req = make_request("d", 2001, 3)
    released: list[bool] = []
    req.remote = RemoteKV(
        link_bandwidth=LINK, published_at=1.0, release=lambda: released.append(True)
    )
    trace = simulate(core, [(0.5, req)])
    transfer = 2000 * 131_072 / LINK  # all prompt tokens but the last, 128 KiB each
    first_step = core.config.device.step_cost([SeqWork(1, 2000)]).seconds
    assert trace.first_token("d") == pytest.approx(1.0 + transfer + first_step)
    assert released == [True]
    assert core.stats.prompt_tokens_transferred == 2000 and core.stats.prompt_tokens_computed == 1


def test_prefill_engine_holds_the_kv_until_released() -> None:
    core = make_core(make_pool(role="prefill"))
    req = make_request("p", 1000, 1)
    req.hold_kv = True
    simulate(core, [(0.0, req)])
    assert req.phase is Phase.FINISHED and "p" in core.held and core.pool.usage > 0
    core.release_held("p")
    assert core.pool.usage == 0 and not core.held


def test_transfer_skips_what_the_decode_engine_already_caches() -> None:
    core = make_core(make_pool(role="decode", prefix_caching=True))
    system = "S" * (1024 * 4)
    simulate(core, [(0.0, make_request("warm", 1100, 1, prefix=system))])
    req = make_request("d", 1100, 1, prefix=system)
    req.remote = RemoteKV(link_bandwidth=LINK, published_at=0.0)
    simulate(core, [(0.0, req)])
    assert req.transferred_tokens == 1099 - 1024


async def _run(ep: SimEndpoint, body: dict[str, Any]) -> tuple[list[str], str, Any]:
    gen = ep.parse("completion", body)
    intent = ep.intent(body)
    handle = ep.submit(gen, ep.new_id("completion"), intent)
    pieces, finish = await asyncio.wait_for(handle.collect(), 5)
    return pieces, finish, handle


def _pair(engine: str, clock: VirtualClock) -> tuple[SimEndpoint, SimEndpoint]:
    from backends.sim.pd import KVTransferHub

    hub = KVTransferHub()
    knobs = {"kv_link_bandwidth": LINK}
    p = SimEndpoint(
        make_pool(engine=engine, role="prefill", pair="d", name="p", knobs=knobs),
        0,
        1,
        clock,
        hub,
        0,
    )
    d = SimEndpoint(
        make_pool(engine=engine, role="decode", name="d", knobs=knobs), 0, 2, clock, hub, 0
    )
    p.runner.start()
    d.runner.start()
    return p, d


async def test_vllm_kv_transfer_params_round_trip() -> None:
    p, d = _pair("vllm", VirtualClock())
    try:
        prompt = {"model": "m", "prompt": "y" * 4 * 600}
        first = {**prompt, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}
        pieces, finish, handle = await _run(p, first)
        assert (len(pieces), finish) == (1, "length")
        params = p.pd.transfer_params(handle.request)
        assert params["do_remote_prefill"] is True and params["remote_engine_id"] == p.engine_id
        assert params["remote_request_id"] == handle.request.rid and params["remote_block_ids"]
        assert p.core.held
        pieces, finish, _ = await _run(
            d, {**prompt, "max_tokens": 20, "kv_transfer_params": params}
        )
        assert (len(pieces), finish) == (20, "length")
        assert d.core.stats.prompt_tokens_transferred == 599
        await asyncio.sleep(0)
        assert not p.core.held and p.core.pool.usage == 0
    finally:
        await p.runner.stop()
        await d.runner.stop()


async def test_vllm_unknown_params_fall_back_to_local_prefill() -> None:
    _, d = _pair("vllm", VirtualClock())
    try:
        params = {"do_remote_prefill": True, "remote_engine_id": "x", "remote_request_id": "y"}
        pieces, finish, _ = await _run(
            d, {"prompt": "z" * 400, "max_tokens": 4, "kv_transfer_params": params}
        )
        assert (len(pieces), finish) == (4, "length")
        assert d.core.stats.prompt_tokens_transferred == 0
    finally:
        await d.runner.stop()


async def test_sglang_bootstrap_room_pairs_prefill_and_decode() -> None:
    p, d = _pair("sglang", VirtualClock())
    try:
        body = {
            "prompt": "w" * 4 * 300,
            "max_tokens": 12,
            "bootstrap_host": "127.0.0.1",
            "bootstrap_port": 8998,
            "bootstrap_room": 12345,
        }
        decode = asyncio.create_task(_run(d, body))
        for _ in range(100):
            await asyncio.sleep(0)
            if d.core.num_transferring:
                break
        assert d.core.num_transferring == 1  # reserved, waiting for the room's KV
        pieces, finish, _ = await _run(p, body)
        assert (len(pieces), finish) == (1, "length")  # a prefill server makes one token
        pieces, finish, _ = await decode
        assert (len(pieces), finish) == (12, "length")
        assert d.core.stats.prompt_tokens_transferred == 299
        assert not p.core.held
    finally:
        await p.runner.stop()
        await d.runner.stop()


def test_sglang_roles_require_a_bootstrap_room_and_mixed_ignores_pd_fields() -> None:
    from backends.sim.pd import KVTransferHub

    dec = SimEndpoint(
        make_pool(engine="sglang", role="decode"), 0, 1, VirtualClock(), KVTransferHub(), 0
    )
    with pytest.raises(ApiError) as err:
        dec.intent({"prompt": "x"})
    assert err.value.status == 400
    mixed = SimEndpoint(make_pool(engine="vllm"), 0, 1, VirtualClock(), KVTransferHub(), 0)
    assert mixed.intent({"kv_transfer_params": {"do_remote_decode": True}}) is None

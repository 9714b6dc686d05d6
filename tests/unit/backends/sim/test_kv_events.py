"""The simulator's KV-cache events, received on real ZMQ sockets on 127.0.0.1 as the gateway
receives vLLM's: stored blocks chained from the prompt's start with the model's token ids and
the engine's block size, a removal for exactly each evicted block, the host tier's placeholders,
replay, the stream rebuilding the simulator's cache, and the fleet's start-up wiring; and as it
receives SGLang's: one-token pages under 64-bit hashes, joined events, self-describing host
copies, and the precise index rebuilt from them holding exactly the router blocks whose every
page the simulator caches."""

from __future__ import annotations

import asyncio
import random
import socket
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq

from backends.kv_events.wire import END_SEQ, Codec, EventCodec, SglangCodec, seq_bytes, seq_of
from backends.sim import start_fleet
from backends.sim.clock import VirtualClock
from backends.sim.endpoint import SimEndpoint
from backends.sim.kv_events import (
    MEDIUM_HOST,
    MEDIUM_HOST_SGLANG,
    SIM_FORMATS,
    SimKvEvents,
    TokenIds,
    alone_id,
    block_key,
    events_of,
    page_key,
)
from backends.sim.kv_publisher import ZmqPublisher
from backends.sim.kvcache import BlockPool, chain_hashes
from backends.sim.pd import KVTransferHub
from backends.sim.request import SimRequest
from config.engines import Engine
from config.fleet import FleetConfigError, parse_fleet
from config.pools import Pool
from routing.features import token_block_hashes
from routing.kv_events.events import MEDIUM_DEVICE, BlocksRemoved, BlocksStored, KvEvent
from routing.kv_events.index import KvEventIndex
from routing.tokens.exact import PromptTokenizer, load_prompt_tokenizer
from tests.fakes.harness import free_ports
from tests.unit.backends.sim.sim_helpers import make_pool

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from tests.fakes.tiny_model import model_folder  # noqa: E402 - needs the tokenizers package

LLAMA_KV = 131_072  # B/token, Llama-3-8B with a 16-bit KV cache
BLOCK = 16  # tokens per block: vLLM on a GPU
PROBE, MARK = b"\x00probe", b"\x00mark"
WAIT_S = 30.0


@pytest.fixture
def tiny(tmp_path: Path) -> PromptTokenizer:
    return load_prompt_tokenizer(model_folder(tmp_path / "model"))


def kv_pool(blocks: int, host_blocks: int = 0, engine: str = "vllm") -> Pool:
    """A vLLM pool on an A100 whose KV cache holds ``blocks`` blocks of 16 tokens (and the
    context one request can fill), with a host tier of ``host_blocks`` blocks; ``engine``
    sglang: the same bytes in one-token pages (a host tier then holds whole GB)."""
    raw = make_pool(prefix_caching=True, engine=engine).model_dump(mode="json")
    raw["model"]["max_context"] = blocks * BLOCK
    raw["hardware"]["kv_cache_bytes"] = blocks * BLOCK * LLAMA_KV
    if host_blocks:
        size = (host_blocks + 0.5) * BLOCK * LLAMA_KV / 1e9
        raw["levers"]["host_kv_cache"] = {"size_gb": size if engine == "vllm" else -(-size // 1)}
        raw["hardware"]["host_link_bandwidth"] = 25e9
    return Pool.model_validate(raw)


class Stream:
    """A SUB socket on a publisher's address; probes are published until one arrives (a PUB
    drops what it sends before the subscription reaches it) and skipped after."""

    def __init__(self, publisher: ZmqPublisher, address: str,
                 codec: EventCodec | None = None) -> None:
        self.publisher = publisher
        self.codec: EventCodec = Codec() if codec is None else codec
        self.payloads: list[bytes] = []
        self.sub: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
        self.sub.connect(address)
        self.sub.subscribe(b"")
        deadline = time.monotonic() + WAIT_S
        while not self.sub.poll(100):
            assert time.monotonic() < deadline, f"no subscription to {address}"
            publisher.publish(PROBE)

    def batches(self) -> list[tuple[int, list[KvEvent]]]:
        """(seq, events) of every batch since the last call: a marker is published and read
        back (PUB/SUB keeps the order)."""
        self.publisher.publish(MARK)
        out: list[tuple[int, list[KvEvent]]] = []
        while True:
            assert self.sub.poll(int(WAIT_S * 1000)), "a batch did not arrive"
            topic, seq, payload = self.sub.recv_multipart()
            if payload == MARK:
                return out
            if payload != PROBE:
                self.payloads.append(payload)
                out.append((seq_of(seq), self.codec.decode(payload)[1]))

    def events(self) -> list[KvEvent]:
        return [e for _, events in self.batches() for e in events]


@asynccontextmanager
async def running(pool: Pool, tokenizer: PromptTokenizer,
                  replay: bool = False) -> AsyncIterator[tuple[SimEndpoint, Stream, str | None]]:
    """An endpoint of ``pool`` on virtual time publishing its events on 127.0.0.1, a stream
    subscribed to them, and the replay address (when ``replay``)."""
    ports = free_ports(2)
    address = f"tcp://127.0.0.1:{ports[0]}"
    replay_address = f"tcp://127.0.0.1:{ports[1]}" if replay else None
    ep = SimEndpoint(pool, 0, 1, VirtualClock(), KVTransferHub(), 0, tokenizer)
    publisher = ZmqPublisher(address, replay_address)
    if pool.engine is Engine.VLLM:
        stream = Stream(publisher, address)
        ep.publish_kv_events(publisher)
    else:  # as publish_kv_events does, in the pool's engine's format
        stream = Stream(publisher, address, SglangCodec())
        ep.kv_events = SimKvEvents(ep.core.pool, TokenIds(tokenizer), publisher,
                                   engine=pool.engine)
        ep.runner.after_step = ep.kv_events.flush
    ep.runner.start()
    try:
        yield ep, stream, replay_address
    finally:
        await ep.runner.stop()
        publisher.close()
        stream.sub.close(linger=0)


def chat(*turns: str, max_tokens: int) -> dict[str, Any]:
    roles = ("user", "assistant")
    return {"messages": [{"role": roles[i % 2], "content": t} for i, t in enumerate(turns)],
            "max_tokens": max_tokens, "ignore_eos": True}


async def ask(ep: SimEndpoint, body: dict[str, Any]) -> tuple[SimRequest, list[str]]:
    handle = ep.submit(ep.parse("chat", body), ep.new_id("chat"), None)
    answer, _ = await asyncio.wait_for(handle.collect(), WAIT_S)
    return handle.request, answer


def text(words: int, seed: int) -> str:
    """``words`` words of the tiny model's vocabulary."""
    rng = random.Random(seed)
    return " ".join(rng.choice(["hello", "world", "you", "are", "terse", "tool"])
                    for _ in range(words))


def stored_of(events: Iterable[KvEvent]) -> list[BlocksStored]:
    return [e for e in events if isinstance(e, BlocksStored)]


def removed_of(events: Iterable[KvEvent]) -> list[BlocksRemoved]:
    return [e for e in events if isinstance(e, BlocksRemoved)]


def keys(hashes: Iterable[int]) -> set[bytes]:
    return {block_key(h) for h in hashes}


# -- what a request stores ---------------------------------------------------------------------

async def test_stored_blocks_chain_from_the_prompts_start_with_its_token_ids(
        tiny: PromptTokenizer) -> None:
    body = chat(text(60, 1), max_tokens=40)
    async with running(kv_pool(64), tiny) as (ep, stream, _):
        req, answer = await ask(ep, body)
        stored = stored_of(stream.events())
    assert stored and stored[0].parent is None
    for before, after in zip(stored, stored[1:], strict=False):
        assert after.parent == before.block_hashes[-1]
    assert all(e.block_size == ep.config.block_size == BLOCK and e.medium == MEDIUM_DEVICE
               and e.plain and len(e.token_ids) == BLOCK * len(e.block_hashes) for e in stored)
    hashes = [h for e in stored for h in e.block_hashes]
    ids = [i for e in stored for i in e.token_ids]
    prompt = list(tiny.prompt_ids(body, "chat") or ())
    # every full block the engine computed: the prompt's and the answer's but its last token
    assert len(ids) == (len(prompt) + len(answer) - 1) // BLOCK * BLOCK
    assert ids == (prompt + [alone_id(tiny, t) for t in answer])[:len(ids)]
    assert hashes == [block_key(h) for h in req.hashes[:len(hashes)]]


async def test_a_prefix_already_cached_is_not_announced_again(tiny: PromptTokenizer) -> None:
    shared = text(50, 2)
    async with running(kv_pool(64), tiny) as (ep, stream, _):
        await ask(ep, chat(shared, max_tokens=4))
        first = {h for e in stored_of(stream.events()) for h in e.block_hashes}
        await ask(ep, chat(shared + " " + text(30, 9), max_tokens=4))
        second = stored_of(stream.events())
    assert first and second
    assert not first & {h for e in second for h in e.block_hashes}
    assert second[0].parent in first  # the new blocks chain on from the cached prefix


# -- what the cache evicts ---------------------------------------------------------------------

async def test_an_eviction_removes_exactly_the_evicted_blocks(tiny: PromptTokenizer) -> None:
    async with running(kv_pool(8), tiny) as (ep, stream, _):
        await ask(ep, chat(text(45, 3), max_tokens=10))
        announced = {h for e in stored_of(stream.events()) for h in e.block_hashes}
        before = keys(ep.core.pool.cached_names())
        await ask(ep, chat("tool " + text(90, 4), max_tokens=20))  # needs every block
        events = stream.events()
        after = keys(ep.core.pool.cached_names())
    assert before == announced
    removed = removed_of(events)
    gone = [h for e in removed for h in e.block_hashes]
    stored = {h for e in stored_of(events) for h in e.block_hashes}
    assert gone and all(len(e.block_hashes) == 1 and e.medium == MEDIUM_DEVICE for e in removed)
    assert len(gone) == len(set(gone)) and set(gone) == (before | stored) - after


# -- the stream as a whole ---------------------------------------------------------------------

def apply(events: Iterable[KvEvent], device: dict[bytes, list[int]], host: set[bytes],
          seen: set[bytes]) -> None:
    """Apply events as a subscriber does, checking each is consistent with what came before."""
    for e in events:
        if isinstance(e, BlocksStored) and e.medium == MEDIUM_HOST:
            assert e.parent is None and e.token_ids == [] and e.block_size == 0
            host.update(e.block_hashes)  # type: ignore[arg-type]
        elif isinstance(e, BlocksStored):
            assert e.parent is None or e.parent in seen
            for i, h in enumerate(e.block_hashes):
                assert isinstance(h, bytes) and len(h) == 32
                device[h] = list(e.token_ids[i * e.block_size:(i + 1) * e.block_size])
                seen.add(h)
        elif isinstance(e, BlocksRemoved):
            held: Any = host if e.medium == MEDIUM_HOST else device
            for h in e.block_hashes:
                assert h in held, "a removal of a block never announced"
                held.remove(h) if isinstance(held, set) else held.pop(h)


async def test_the_stream_rebuilds_the_simulators_cache_device_and_host(
        tiny: PromptTokenizer) -> None:
    device: dict[bytes, list[int]] = {}
    host: set[bytes] = set()
    seen: set[bytes] = set()
    first = text(45, 5)
    async with running(kv_pool(8, host_blocks=16), tiny) as (ep, stream, _):
        _, answer = await ask(ep, chat(first, max_tokens=12))
        await ask(ep, chat("tool " + text(80, 6), max_tokens=20))  # evicts the first
        await ask(ep, chat(first, max_tokens=6))  # back from the host tier
        await ask(ep, chat(first, "".join(answer), "hello", max_tokens=8))  # the next turn
        for seed in (7, 8, 9):  # more than the host tier holds
            await ask(ep, chat("you " + text(70, seed), max_tokens=30))
        events = stream.events()
        apply(events, device, host, seen)
        pool = ep.core.pool
        assert set(device) == keys(pool.cached_names())
        assert pool.host is not None and host == keys(pool.host.names())
    assert ep.core.stats.host_hits > 0 and removed_of(events)
    assert any(e.medium == MEDIUM_HOST for e in removed_of(events))  # the host tier dropped some


async def test_replay_from_a_seq_gives_the_batches_sent_live(tiny: PromptTokenizer) -> None:
    async with running(kv_pool(8), tiny, replay=True) as (ep, stream, replay_address):
        assert replay_address is not None
        for seed in range(3):
            await ask(ep, chat(text(40, seed), max_tokens=20))
        live = stream.batches()
        start = live[1][0]
        replayed = replay(replay_address, start)
    assert [seq for seq, _ in live] == list(range(live[0][0], live[0][0] + len(live)))
    assert replayed == [(seq, events) for seq, events in live if seq >= start]


def replay(address: str, start: int,
           codec: EventCodec | None = None) -> list[tuple[int, list[KvEvent]]]:
    """The decoded batches a DEALER gets back from ``start`` on (probes and markers left out)."""
    codec = Codec() if codec is None else codec
    dealer: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    dealer.connect(address)
    out: list[tuple[int, list[KvEvent]]] = []
    try:
        dealer.send_multipart((b"", seq_bytes(start)))
        while True:
            assert dealer.poll(int(WAIT_S * 1000)), "the replay socket did not answer"
            empty, _, seq, payload = dealer.recv_multipart()
            assert empty == b""
            if seq == END_SEQ:
                return out
            if payload not in (PROBE, MARK):
                out.append((seq_of(seq), codec.decode(payload)[1]))
    finally:
        dealer.close(linger=0)


# -- one step's changes, as events -------------------------------------------------------------

def prompt_request(rid: str, text_: str, ids: list[int] | None) -> SimRequest:
    toks = list(text_)
    req = SimRequest(rid=rid, tokens=toks, prompt_tokens=len(toks), max_tokens=1,
                     finish_reason="length", arrival=0.0, rng=random.Random(0), prompt_ids=ids)
    req.hashes = chain_hashes(toks, 2, 0, 0)
    return req


def test_a_steps_device_changes_come_in_order_then_the_host_tiers(
        tiny: PromptTokenizer) -> None:
    pool = BlockPool(6, 2, True, host_blocks=2)
    pool.record_changes()
    a = prompt_request("a", "abcdef", [1, 2, 3, 4, 5, 6])
    blocks = pool.allocate(3)
    assert blocks is not None
    for j in (0, 1, 2):
        pool.name(blocks[j], a.hashes[j], a, j)
    ka = [block_key(h) for h in a.hashes]
    assert events_of(pool.take_changes(), 2, TokenIds(tiny)) == [
        BlocksStored(ka, None, [1, 2, 3, 4, 5, 6], 2, MEDIUM_DEVICE),
        BlocksStored([ka[0]], None, [], 0, MEDIUM_HOST),
        BlocksStored([ka[1]], None, [], 0, MEDIUM_HOST),
        BlocksStored([ka[2]], None, [], 0, MEDIUM_HOST),
        BlocksRemoved([ka[0]], MEDIUM_HOST),  # the host tier holds two blocks
    ]
    assert pool.take_changes() == []


def test_blocks_without_token_ids_are_not_announced_but_their_eviction_is(
        tiny: PromptTokenizer) -> None:
    pool = BlockPool(2, 2, True)
    pool.record_changes()
    estimated = prompt_request("e", "wxyz", None)
    blocks = pool.allocate(2)
    assert blocks is not None
    pool.name(blocks[0], estimated.hashes[0], estimated, 0)
    pool.name(blocks[1], 99)  # a caller that does not say whose block it is
    assert events_of(pool.take_changes(), 2, TokenIds(tiny)) == []
    pool.release(blocks)
    pool.allocate(2)
    gone = events_of(pool.take_changes(), 2, TokenIds(tiny))
    assert [h for e in removed_of(gone) for h in e.block_hashes] == [
        block_key(99), block_key(estimated.hashes[0])]  # freed last block first, evicted so


def test_a_generated_token_has_the_id_its_text_has_alone(tiny: PromptTokenizer) -> None:
    assert alone_id(tiny, "hello") == 7  # the tiny model adds a BOS to a completion: cut
    assert alone_id(tiny, " world") == 8
    assert alone_id(tiny, "hello world") == 7  # two tokens: the first
    assert alone_id(tiny, "") == 0
    ids = TokenIds(tiny)
    req = prompt_request("r", "ab", [7, 8])
    req.tokens += [" you", " zzz"]
    assert ids.span(req, 0, 4) == [7, 8, 4, 0]  # an unknown word is the model's [UNK]
    assert ids.span(req, 3, 4) == [0] and ids.span(req, 0, 1) == [7]


# -- SGLang ----------------------------------------------------------------------------------

def sglang_pool(blocks: int, host: bool = False) -> Pool:
    """An SGLang pool of ``blocks`` × 16 one-token pages, with a 1 GB host tier if ``host``."""
    return kv_pool(blocks, 1 if host else 0, "sglang")


def test_an_sglang_pool_is_told_apart_by_the_format_table() -> None:
    assert SIM_FORMATS[Engine.SGLANG].key(5) == page_key(5)
    assert page_key(5) == int.from_bytes(block_key(5)[:8], "big", signed=True)
    assert SIM_FORMATS[Engine.SGLANG].host_medium == MEDIUM_HOST_SGLANG == "CPU_PINNED"
    assert SIM_FORMATS[Engine.VLLM].key(5) == block_key(5)


async def test_sglang_pages_chain_under_64_bit_hashes_in_sglangs_batches(
        tiny: PromptTokenizer) -> None:
    body = chat(text(60, 1), max_tokens=40)
    async with running(sglang_pool(64), tiny) as (ep, stream, replay_address):
        req, answer = await ask(ep, body)
        events = stream.events()
        raw = [msgspec.msgpack.decode(p) for p in stream.payloads]
    assert ep.config.block_size == 1 and replay_address is None
    stored = stored_of(events)
    assert stored and stored[0].parent is None
    for before, after in zip(stored, stored[1:], strict=False):
        assert after.parent == before.block_hashes[-1]
    assert all(e.block_size == 1 and e.medium == MEDIUM_DEVICE and e.plain
               and len(e.token_ids) == len(e.block_hashes) for e in stored)
    assert len(stored[0].block_hashes) > 1  # the prompt's pages: one event
    hashes = [h for e in stored for h in e.block_hashes]
    assert hashes == [page_key(h) for h in req.hashes[:len(hashes)]]
    ids = [i for e in stored for i in e.token_ids]
    prompt = list(tiny.prompt_ids(body, "chat") or ())
    assert len(ids) == len(prompt) + len(answer) - 1  # every token computed: all but the last
    assert ids == (prompt + [alone_id(tiny, t) for t in answer])[:len(ids)]
    # SGLang's batch: [ts, events, attn_dp_rank], its events maps tagged by type
    assert raw and all(len(b) == 3 and b[2] == 0 for b in raw)
    assert all(e["type"] == "BlockStored" and isinstance(e["block_hashes"][0], int)
               for b in raw for e in b[1])


async def test_an_sglang_eviction_removes_exactly_the_evicted_pages_joined(
        tiny: PromptTokenizer) -> None:
    async with running(sglang_pool(8), tiny) as (ep, stream, _):
        await ask(ep, chat(text(45, 3), max_tokens=10))
        announced = {h for e in stored_of(stream.events()) for h in e.block_hashes}
        before = {page_key(h) for h in ep.core.pool.cached_names()}
        await ask(ep, chat("tool " + text(90, 4), max_tokens=20))  # needs every page
        events = stream.events()
        after = {page_key(h) for h in ep.core.pool.cached_names()}
    assert before == announced
    removed = removed_of(events)
    gone = [h for e in removed for h in e.block_hashes]
    stored = {h for e in stored_of(events) for h in e.block_hashes}
    assert gone and all(e.medium == MEDIUM_DEVICE for e in removed)
    assert any(len(e.block_hashes) > 1 for e in removed)  # consecutive removals joined
    assert len(gone) == len(set(gone)) and set(gone) == (before | stored) - after


def apply_sglang(events: Iterable[KvEvent], media: dict[int, set[str]]) -> None:
    """Apply SGLang's events as a subscriber does, checking each is consistent with what came
    before: every store, the host tier's too, names its tokens and a known parent."""
    for e in events:
        if isinstance(e, BlocksStored):
            assert e.medium in (MEDIUM_DEVICE, MEDIUM_HOST_SGLANG)
            assert e.parent is None or e.parent in media, "a store after an unknown page"
            assert e.block_size == 1 and len(e.token_ids) == len(e.block_hashes)
            for h in e.block_hashes:
                assert isinstance(h, int)
                media.setdefault(h, set()).add(str(e.medium))
        elif isinstance(e, BlocksRemoved):
            for h in e.block_hashes:
                assert isinstance(h, int) and e.medium in media.get(h, set())
                media[h].discard(str(e.medium))


@pytest.mark.parametrize("host", [False, True], ids=["device", "host-tier"])
async def test_sglangs_stream_gives_the_index_exactly_the_router_blocks_cached(
        tiny: PromptTokenizer, host: bool) -> None:
    """The precise index fed the stream holds a router block (16 tokens) exactly when the
    simulator caches each of its pages, on the device or in the host tier (which, 1 GB, keeps
    every page here)."""
    url = "http://127.0.0.1:1"
    index = KvEventIndex(16, 100_000)
    index.follow(url, ["m"])
    media: dict[int, set[str]] = {}
    first, asked = text(45, 5), []
    async with running(sglang_pool(8, host), tiny, replay=True) as (ep, stream, address):
        _, answer = await ask(ep, chat(first, max_tokens=12))
        bodies = [chat("tool " + text(80, 6), max_tokens=20),  # evicts the first
                  chat(first, max_tokens=6),  # back from the host tier
                  chat(first, "".join(answer), "hello", max_tokens=8),  # the next turn
                  *[chat("you " + text(70, seed), max_tokens=30) for seed in (7, 8)]]
        for body in bodies:
            asked.append((await ask(ep, body))[0])
        live = stream.batches()
        assert address is not None
        events = [e for _, batch in replay(address, 0, SglangCodec()) for e in batch]
        assert events == [e for _, batch in live for e in batch]  # replay: all of it
        apply_sglang(events, media)
        index.apply(url, events)
        pool = ep.core.pool
        cached = set(pool.cached_names())
        hosted = set() if pool.host is None else set(pool.host.names())
        held_ids, ids = TokenIds(tiny), {h for h, m in media.items() if m}
    assert (ep.core.stats.host_hits > 0) == host
    assert ids == {page_key(h) for h in cached | hosted}
    assert {h for h, m in media.items() if MEDIUM_HOST_SGLANG in m} == {
        page_key(h) for h in hosted}
    held: set[int] = set()
    not_held: set[int] = set()
    on_host: set[int] = set()
    partly: set[int] = set()
    for req in asked:
        routers = token_block_hashes(held_ids.span(req, 0, len(req.hashes)) or [], 16, "m")
        for k, router in enumerate(routers):
            pages = req.hashes[16 * k:16 * (k + 1)]
            (held if all(p in cached or p in hosted for p in pages) else not_held).add(router)
            if not all(p in cached for p in pages):
                on_host.add(router)
                if any(p in cached for p in pages):
                    partly.add(router)
    assert held
    if host:  # blocks the device evicted (a page or more) are held by the host tier
        assert on_host & held and not not_held
    else:  # some blocks are still cached, some were evicted, some only partly
        assert not_held - held and partly - held
    assert all(index.match([h], [url]) == {url: 1} for h in held)
    assert all(index.match([h], [url]) == {} for h in not_held - held)
    assert index.held_blocks() == {url: len(held)}


# -- start-up ----------------------------------------------------------------------------------

def kv_fleet(tokenizer_folder: Path | None, http_port: int, kv_port: int,
             replay_port: int) -> dict[str, Any]:
    pool = kv_pool(64).model_dump(mode="json", exclude_none=True)
    pool.update(endpoints=[f"http://127.0.0.1:{http_port}"],
                kv_events={"port": kv_port, "replay_port": replay_port, "topic": "sim"})
    features = {"tokenizers": {"m": str(tokenizer_folder)}} if tokenizer_folder else {}
    return {"pools": [pool], "routing": {"features": features}}


async def test_the_fleet_publishes_each_endpoints_events_on_the_pools_address(
        tmp_path: Path) -> None:
    http, kv, replay_port = free_ports(3)
    running_fleet = await start_fleet(parse_fleet(kv_fleet(model_folder(tmp_path / "m"), http,
                                                           kv, replay_port)))
    try:
        ep = running_fleet.servers[0].endpoint
        assert ep.kv_events is not None and isinstance(ep.kv_events.publisher, ZmqPublisher)
        stream = Stream(ep.kv_events.publisher, f"tcp://127.0.0.1:{kv}")
        try:
            await ask(ep, chat(text(40, 8), max_tokens=8))
            assert stored_of(stream.events())
            replayed = replay(f"tcp://127.0.0.1:{replay_port}", 0)
            assert stored_of(e for _, events in replayed for e in events)
        finally:
            stream.sub.close(linger=0)
    finally:
        await running_fleet.stop()
    _bind_when_free(kv)  # the publisher let go of its address


def test_a_pool_whose_model_has_no_tokenizer_cannot_publish() -> None:
    http, kv, replay_port = free_ports(3)
    with pytest.raises(FleetConfigError, match="kv_events.*tokenizer"):
        asyncio.run(start_fleet(parse_fleet(kv_fleet(None, http, kv, replay_port))))
    _bind_when_free(http)  # nothing was started


async def test_a_taken_event_port_stops_start_up_naming_the_pool(tmp_path: Path) -> None:
    http, kv, replay_port = free_ports(3)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", kv))
        taken.listen()
        with pytest.raises(OSError, match=rf"pool 'p'.*127\.0\.0\.1:{kv}"):
            await start_fleet(parse_fleet(kv_fleet(model_folder(tmp_path / "m"), http, kv,
                                                   replay_port)))
    _bind_when_free(http)  # the endpoint's HTTP server was closed again


def _bind_when_free(port: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while True:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past TIME_WAIT: listeners
            try:
                s.bind(("127.0.0.1", port))
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
        time.sleep(0.05)

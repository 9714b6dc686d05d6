"""Admission control on the request path: room, waiting, fairness, refusals, metrics.

Real router state and router over a registry whose engine figures set each endpoint's
capacity; a fake clock for budgets (no test depends on a wall-clock deadline: waits end by a
release or by moving the fake clock, and ``recheck_s`` is long unless a test needs it short).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from backends.registry.endpoints import EndpointRegistry
from backends.registry.status import PollResult
from config.fleet import parse_fleet
from gateway.access.admission import Admission, AdmissionConfig, Placement, Route, cache_affine
from gateway.app import build_admission, build_router
from gateway.server.errors import GatewayError
from gateway.settings import AdmissionSettings
from gateway.telemetry.prometheus import Telemetry
from gateway.telemetry.slos import ModelSlo, SloPolicy
from routing.features import FeatureExtractor, RequestInfo
from routing.formulas import Bounds
from routing.router import Router
from routing.snapshots import EngineMetrics
from routing.state.memory import MemoryState
from routing.state.protocol import Ask, Outcome, Reservation, StateView
from tests.fakes.harness import HARDWARE, MODEL_FACTS, fleet_of

A, B = "http://a:1", "http://b:1"
ONE_EACH = EngineMetrics(running=1.0, waiting=0.0, kv_cache_usage=0.9)
"""Capacity 0.9 × 1 ÷ 0.9 = 1 request per endpoint."""
OUTCOME = Outcome("m", (), 10, 0, 5, None, True)


@dataclass
class Clock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Rig:
    admission: Admission
    state: MemoryState
    router: Router
    registry: EndpointRegistry
    clock: Clock
    metrics: CollectorRegistry

    def route(self, key: str | None = None) -> tuple[Ask, Route]:
        features = FeatureExtractor().extract(
            {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            RequestInfo("chat", "m", None, True, None, None))
        pools = self.registry.snapshot()
        urls = [e.url for p in pools for e in p.endpoints]
        return (Ask("m", features.block_hashes, None, urls, 10),
                Route(self.router, features, pools, frozenset(), key))

    async def place(self, key: str | None = None) -> Placement:
        ask, route = self.route(key)
        return await self.admission.place(self.state, ask, route)

    async def release(self, held: Reservation) -> None:
        await self.state.finish(held, OUTCOME)
        self.admission.released(held.endpoint)

    def sample(self, name: str, **labels: str) -> float | None:
        return self.metrics.get_sample_value(name, labels)


def rig(urls: tuple[str, ...] = (A, B), metrics: EngineMetrics = ONE_EACH,
        ttft_s: float | None = None, max_wait_s: float = 1000.0, max_queue: int = 256,
        recheck_s: float = 30.0) -> Rig:
    fleet = fleet_of({"p": list(urls)})
    registry = EndpointRegistry(fleet)
    for url in urls:
        registry.record_poll(url, PollResult(registry.now(), True, metrics))
    slos = SloPolicy({"m": ModelSlo(Bounds(ttft_s=ttft_s))}) if ttft_s else SloPolicy()
    clock, collector = Clock(), CollectorRegistry()
    telemetry = Telemetry(collector, frozenset({"m"}))
    admission = Admission(AdmissionConfig(max_wait_s, max_queue, recheck_s), slos,
                          registry.snapshot, telemetry, clock)
    return Rig(admission, MemoryState(clock=clock), build_router(fleet), registry, clock,
               collector)


async def held(r: Rig, key: str | None = None) -> Reservation:
    placed, waited = await r.place(key)
    assert placed is not None and waited == 0.0
    return placed.reservations[0]


async def full(r: Rig) -> list[Reservation]:
    """Every endpoint holding its one request, after a slot was freed once (so the pool's
    release rate is known: with the fake clock standing still, any wait is expected short)."""
    first = await held(r)
    await r.release(first)
    return [await held(r) for _ in r.registry.urls]


async def queued(r: Rig, n: int) -> None:
    """Let the event loop run until ``n`` requests wait in pool ``p``."""
    for _ in range(1000):
        if r.admission.waiting("p") == n:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{r.admission.waiting('p')} waiting, expected {n}")


async def test_with_room_a_request_is_placed_at_once() -> None:
    r = rig()
    first, second = await held(r), await held(r)
    assert {first.endpoint, second.endpoint} == {A, B}  # the full one is left out
    assert r.admission.waiting("p") == 0


async def test_an_unknown_capacity_never_holds_a_request() -> None:
    r = rig(metrics=EngineMetrics(running=0.0, waiting=0.0))
    for _ in range(6):
        await held(r)
    assert r.state.in_flight()[A].requests + r.state.in_flight()[B].requests == 6


async def test_a_full_pool_queues_and_a_release_places_the_head_at_once() -> None:
    r = rig()
    first, _ = await full(r)
    waiter = asyncio.create_task(r.place())
    await queued(r, 1)
    assert r.sample("ridge_admission_queue_depth", pool="p") == 1
    r.clock.now += 0.3
    await r.release(first)  # recheck_s is 30 s: only the release can wake it
    placed, waited = await asyncio.wait_for(waiter, 10)
    assert placed is not None and placed.reservations[0].endpoint == first.endpoint
    assert waited == pytest.approx(0.3)
    assert r.sample("ridge_admission_queue_depth", pool="p") == 0
    assert r.sample("ridge_admission_wait_seconds_count", pool="p") == 1


async def test_keys_take_turns_for_the_slots_that_free_up() -> None:
    r = rig(urls=(A,))
    [holder] = await full(r)
    tasks = {name: asyncio.create_task(r.place(key)) for name, key in
             (("x1", "X"), ("x2", "X"), ("x3", "X"))}
    await queued(r, 3)
    tasks["y1"] = asyncio.create_task(r.place("Y"))
    await queued(r, 4)
    order = []
    while tasks:
        await r.release(holder)
        done, _ = await asyncio.wait(tasks.values(), timeout=10,
                                     return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1, "one slot, one request"
        name = next(n for n, t in tasks.items() if t in done)
        placed, _ = tasks.pop(name).result()
        assert placed is not None
        holder = placed.reservations[0]
        order.append(name)
    assert order == ["x1", "y1", "x2", "x3"]


async def test_a_newcomer_does_not_overtake_a_waiting_request() -> None:
    r = rig(urls=(A,))
    [holder] = await full(r)
    first = asyncio.create_task(r.place("X"))
    await queued(r, 1)
    await r.release(holder)
    newcomer = asyncio.create_task(r.place("Y"))  # before the woken head has run
    placed, _ = await asyncio.wait_for(first, 10)
    assert placed is not None and not newcomer.done()
    await queued(r, 1)
    await r.release(placed.reservations[0])
    late, _ = await asyncio.wait_for(newcomer, 10)
    assert late is not None


async def test_a_full_queue_refuses_at_once_with_retry_after() -> None:
    r = rig(urls=(A,), max_queue=1)
    await full(r)
    waiter = asyncio.create_task(r.place())
    await queued(r, 1)
    with pytest.raises(GatewayError) as info:
        await r.place()
    err = info.value
    assert err.status == 503 and err.code == "overloaded" and "queue is full" in err.message
    assert dict(err.headers)[b"retry-after"].isdigit()
    assert int(dict(err.headers)[b"retry-after"]) >= 1
    assert dict(err.headers)[b"x-ridge-route"] == b"pool=p; refused=queue_full"
    assert r.sample("ridge_admission_rejected_total", pool="p", reason="queue_full") == 1
    waiter.cancel()


async def test_a_request_that_would_wait_past_its_slo_is_refused_at_once() -> None:
    r = rig(urls=(A,), ttft_s=1.0)
    holder = await held(r)
    for i in range(3):  # one release every 1/6 s: 6 a second
        r.clock.now = 100.0 + i / 6
        r.admission.released(A)
    # a wait it will seldom exceed, (n + 2 √n) ÷ 6/s: 0.50 s for the first, 0.80 s for the
    # second (one request ahead), within the 1.0 s budget: both wait
    waiters = [asyncio.create_task(r.place(f"k{i}")) for i in range(2)]
    await queued(r, 2)
    # served after 2 (one of each key): (3 + 2 √3) ÷ 6/s = 1.08 s > 1.0 s of budget
    with pytest.raises(GatewayError) as info:
        await r.place("k9")
    assert info.value.status == 503 and "1.08 s" in info.value.message
    assert dict(info.value.headers)[b"retry-after"] == b"1"  # ⌈1.08 − 1.0⌉
    assert r.sample("ridge_admission_rejected_total", pool="p", reason="would_miss_slo") == 1
    for w in waiters:
        w.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    assert r.admission.waiting("p") == 0 and holder.endpoint == A


async def test_an_idle_gap_does_not_read_as_a_slow_release_rate() -> None:
    """Requests that hold a slot ~20 s, then an hour with nothing in flight: the refusal's
    Retry-After says about the 20 s a slot takes, not the hour."""
    r = rig(urls=(A,), ttft_s=1.0)
    holding = await held(r)
    for i in range(1, 4):  # a busy spell: each request holds its slot 20 s, the next follows
        r.clock.now = 100.0 + 20.0 * i
        await r.release(holding)
        if i < 3:
            holding = await held(r)
    r.clock.now += 3600.0  # idle: nothing in flight
    await held(r)  # busy again
    r.clock.now += 5.0
    with pytest.raises(GatewayError) as info:
        await r.place()
    assert "would wait about 60.00 s" in info.value.message  # (1 + 2 √1) × 20 s, seldom more
    assert dict(info.value.headers)[b"retry-after"] == b"19"  # the mean wait, 20 s − 1 s


async def test_before_any_slot_was_freed_a_request_is_refused_rather_than_held() -> None:
    r = rig(urls=(A,), ttft_s=1.0)
    await held(r)
    with pytest.raises(GatewayError) as info:
        await r.place()
    assert "no slot has been freed" in info.value.message
    assert dict(info.value.headers)[b"retry-after"] == b"1"
    assert r.sample("ridge_admission_rejected_total", pool="p", reason="would_miss_slo") == 1


async def test_an_engine_slower_than_the_slo_leaves_no_time_to_wait() -> None:
    r = rig(urls=(A,), ttft_s=1.0)
    await held(r)
    r.admission.observed_ttft("p", 0.9)  # floor 0.9 + 2 × 0.45 > 1.0: budget 0
    assert r.admission.budget_s("p", r.route()[1].features, None) == 0.0
    with pytest.raises(GatewayError) as info:
        await r.place()
    assert "cannot wait for a slot" in info.value.message


async def test_the_budget_running_out_refuses_the_waiting_request() -> None:
    r = rig(urls=(A,), ttft_s=1.0, recheck_s=0.01)
    await full(r)
    waiter = asyncio.create_task(r.place())
    await queued(r, 1)
    r.clock.now += 2.0  # past its 1 s budget
    with pytest.raises(GatewayError) as info:
        await asyncio.wait_for(waiter, 10)
    assert info.value.status == 503 and "no slot freed" in info.value.message
    assert r.sample("ridge_admission_rejected_total", pool="p", reason="wait_expired") == 1
    assert r.admission.waiting("p") == 0


async def test_a_model_without_a_ttft_slo_waits_at_most_max_wait() -> None:
    r = rig(urls=(A,), max_wait_s=10.0)
    assert r.admission.budget_s("p", r.route()[1].features, None) == 10.0


async def test_a_client_leaving_takes_its_request_out_of_the_queue() -> None:
    r = rig(urls=(A,))
    [holder] = await full(r)
    leaving = asyncio.create_task(r.place("X"))
    staying = asyncio.create_task(r.place("Y"))
    await queued(r, 2)
    leaving.cancel()
    await asyncio.gather(leaving, return_exceptions=True)
    assert r.admission.waiting("p") == 1
    await r.release(holder)
    placed, _ = await asyncio.wait_for(staying, 10)
    assert placed is not None


async def test_a_request_no_healthy_endpoint_could_take_is_not_queued() -> None:
    r = rig()
    r.registry.mark_failed(A, "down")
    r.registry.mark_failed(B, "down")
    placed, waited = await r.place()
    assert placed is None and waited == 0.0 and r.admission.waiting("p") == 0


def test_the_app_builds_it_from_the_settings_and_the_fleets_slos() -> None:
    fleet = parse_fleet({"pools": [{"name": "p", "engine": "vllm", "models": ["m"],
                                    "endpoints": [A], "model": MODEL_FACTS,
                                    "hardware": HARDWARE}],
                         "slos": {"*": {"ttft_s": 2.0}}})
    registry = EndpointRegistry(fleet)
    assert build_admission(AdmissionSettings(enabled=False), fleet, registry.snapshot) is None
    admission = build_admission(AdmissionSettings(max_wait_s=1.5), fleet, registry.snapshot)
    assert admission is not None
    features = rig().route()[1].features
    assert admission.budget_s("p", features, None) == 1.5  # min(2.0 − 0, 1.5)


def _long_route(r: Rig, text: str) -> tuple[Ask, Route]:
    features = FeatureExtractor().extract(
        {"model": "m", "messages": [{"role": "user", "content": text}]},
        RequestInfo("chat", "m", None, True, None, None))
    pools = r.registry.snapshot()
    urls = [e.url for p in pools for e in p.endpoints]
    return (Ask("m", features.block_hashes, None, urls, 10),
            Route(r.router, features, pools, frozenset(), None))


@pytest.mark.parametrize(("affinity", "follow_up", "same_place"), [
    (0.5, "", True),            # its whole prompt is cached on the full endpoint: it goes there
    (0.0, "", False),           # affinity off: the endpoint with room takes it
    (0.5, " more" * 1000, False),  # a third of it is cached there: the one with room
])
async def test_a_request_whose_cache_is_on_a_full_endpoint_waits_there(
        affinity: float, follow_up: str, same_place: bool) -> None:
    r = rig()
    r.admission = Admission(AdmissionConfig(1000.0, 256, 30.0, cache_affinity=affinity),
                            SloPolicy(), r.registry.snapshot, None, r.clock)
    opening = " ".join(f"word{i}" for i in range(300))  # ~600 tokens: dozens of blocks
    ask, route = _long_route(r, opening)
    first, _ = await r.admission.place(r.state, ask, route)  # that endpoint is now full
    assert first is not None
    ask, route = _long_route(r, opening + follow_up)
    second, waited = await r.admission.place(r.state, ask, route)
    assert second is not None and waited == 0.0
    same = second.reservations[0].endpoint == first.reservations[0].endpoint
    assert same is same_place


@pytest.mark.parametrize(("exact", "sent", "affine"), [
    (3, None, False),   # no events: a third of the prompt there, under the 0.5 affinity
    (3, 9, True),       # events say a third is left of the whole prompt sent there: its home
    (9, 3, True),       # events say more is there than was sent (another request's blocks)
    (1, 2, False),      # sent there, but under the affinity either way
])
def test_with_kv_events_the_blocks_sent_to_an_endpoint_count_for_cache_affinity(
        exact: int, sent: int | None, affine: bool) -> None:
    r = rig()
    _, route = _long_route(r, " ".join(f"word{i}" for i in range(300)))
    plan = route.router.choose(route.features, route.pools, StateView(), frozenset())
    assert plan is not None
    home = B if plan.first.url == A else A
    ninth = len(route.features.block_hashes) / 9
    view = StateView(matched_blocks={home: round(exact * ninth)},
                     exact_endpoints=frozenset({A, B}),
                     sent_blocks=None if sent is None else {home: round(sent * ninth)})
    assert cache_affine(route.features, view, frozenset({home}), plan, 0.5) is affine


def test_capacities_are_the_requests_an_engine_holds_before_it_counts_full() -> None:
    r = rig(metrics=EngineMetrics(running=2.0, waiting=0.0, kv_cache_usage=0.45))
    assert r.admission.capacities() == [("p", A, 4), ("p", B, 4)]  # ⌊0.9 × 2 ÷ 0.45⌋
    idle = rig(metrics=EngineMetrics(running=0.0, waiting=0.0, kv_cache_usage=0.0))
    assert idle.admission.capacities() == []  # nothing running: not known yet


def test_the_app_gives_each_pool_its_roofline_prefill_rate_until_one_is_measured() -> None:
    fleet = parse_fleet({"pools": [
        {"name": "p", "engine": "vllm", "models": ["m"], "endpoints": [A], "model": MODEL_FACTS,
         "hardware": HARDWARE, "levers": {"chunked_prefill": {"token_budget": 512}}},
        {"name": "bare", "engine": "vllm", "models": ["m"], "endpoints": [B]}]})
    registry = EndpointRegistry(fleet)
    admission = build_admission(AdmissionSettings(prefill_efficiency=0.5), fleet,
                                registry.snapshot)
    assert admission is not None
    prior = admission.prefill_rate("p")
    assert prior is not None and prior > 0 and admission.prefill_rate("bare") is None
    admission.capacities()  # the endpoints' pools learned, as at a first placement
    ahead = admission.prefill_started(A, 4000)
    admission.prefill_done(A, 4000, ahead, engine_ttft_s=2.0)
    assert admission.prefill_rate("p") == 2000.0  # the first measure replaces the prior


@pytest.mark.parametrize("priors", [{}, {"p": 1000.0}])
async def test_a_cold_burst_is_paced_by_the_prior_before_any_first_token(
        priors: dict[str, float]) -> None:
    """Nothing measured yet, a long prompt in prefill on each endpoint: a prior of 1,000
    tokens/s, a TTFT SLO of 1 s and a target of 0.5 leave neither room for another ~900-token
    prompt (no slot ever freed: refused at once); without a prior nothing is paced."""
    r = rig(ttft_s=1.0)
    r.admission = Admission(AdmissionConfig(1000.0, 256, 30.0), SloPolicy(
        {"m": ModelSlo(Bounds(ttft_s=1.0))}), r.registry.snapshot, None, r.clock,
        prefill_priors=priors)
    for url in (A, B):
        r.admission.prefill_started(url, 2000)
    ask, route = _long_route(r, " ".join(f"word{i}" for i in range(400)))
    if not priors:
        placed, _ = await r.admission.place(r.state, ask, route)
        assert placed is not None
        return
    with pytest.raises(GatewayError) as info:
        await r.admission.place(r.state, ask, route)
    assert info.value.status == 503


class NetworkState:
    """The in-memory state behind the awaits of one over the network (Redis): a read before
    it chooses, the reserve's reply after."""

    def __init__(self, inner: MemoryState) -> None:
        self.inner = inner

    async def place(self, ask: Ask, choose: Any) -> Any:
        await asyncio.sleep(0)
        placed = await self.inner.place(ask, choose)
        await asyncio.sleep(0)
        return placed


async def test_requests_placed_together_over_the_network_see_each_others_prefill() -> None:
    """Three long prompts at once through a state that awaits before and after it chooses:
    each endpoint takes one (nothing outstanding there), the third finds both paced by the
    prompts still on their way — and, no slot ever freed, is refused. Capacity is no limit
    here (0.9 × 1 ÷ 0.1 = 9 requests per endpoint)."""
    r = rig(metrics=EngineMetrics(running=1.0, waiting=0.0, kv_cache_usage=0.1), ttft_s=1.0)
    r.admission = Admission(AdmissionConfig(1000.0, 256, 30.0), SloPolicy(
        {"m": ModelSlo(Bounds(ttft_s=1.0))}), r.registry.snapshot, None, r.clock,
        prefill_priors={"p": 1000.0})
    state = NetworkState(r.state)

    async def one(n: int) -> str:  # prompts of their own: no cache to follow
        ask, route = _long_route(r, " ".join(f"word{n}-{i}" for i in range(400)))
        placed, _ = await r.admission.place(state, ask, route)  # type: ignore[arg-type]
        assert placed is not None
        url = placed.reservations[0].endpoint
        r.admission.prefill_started(url, route.features.prompt_tokens)  # as dispatch does
        return url

    outcomes = await asyncio.gather(one(0), one(1), one(2), return_exceptions=True)
    placed = sorted(o for o in outcomes if isinstance(o, str))
    refused = [o for o in outcomes if isinstance(o, GatewayError)]
    assert placed == [A, B] and len(refused) == 1 and refused[0].status == 503


async def test_a_gateway_paces_by_the_prompts_other_gateways_placed_in_the_shared_state(
) -> None:
    """Two gateways sharing one router state (as through Redis), capacity no limit: the
    second sees the first's request on an endpoint it did not place there and takes it for a
    prompt still prefilling (its own prompt's size, for as long as that takes at the prior
    rate), so its own two go elsewhere and then nowhere."""
    r = rig(metrics=EngineMetrics(running=1.0, waiting=0.0, kv_cache_usage=0.1), ttft_s=1.0)
    slos = SloPolicy({"m": ModelSlo(Bounds(ttft_s=1.0))})

    def gateway() -> Admission:
        return Admission(AdmissionConfig(1000.0, 256, 30.0), slos, r.registry.snapshot, None,
                         r.clock, prefill_priors={"p": 1000.0})

    first, second = gateway(), gateway()
    ask, route = _long_route(r, " ".join(f"one-{i}" for i in range(400)))
    placed, _ = await first.place(r.state, ask, route)
    assert placed is not None
    taken = placed.reservations[0].endpoint
    ask, route = _long_route(r, " ".join(f"two-{i}" for i in range(400)))
    placed, _ = await second.place(r.state, ask, route)
    assert placed is not None and placed.reservations[0].endpoint != taken
    second.prefill_started(placed.reservations[0].endpoint, route.features.prompt_tokens)
    ask, route = _long_route(r, " ".join(f"three-{i}" for i in range(400)))
    with pytest.raises(GatewayError) as info:
        await second.place(r.state, ask, route)
    assert info.value.status == 503
    r.clock.now += 60.0  # long after the first gateway's prompt would have been prefilled
    placed, _ = await second.place(r.state, ask, route)
    assert placed is not None and placed.reservations[0].endpoint == taken


@pytest.mark.parametrize(("outstanding", "queued"), [(300, True), (5000, False)])
async def test_held_by_pacing_alone_before_any_release_it_waits_if_its_prefill_fits(
        outstanding: int, queued: bool) -> None:
    """One endpoint, capacity no limit, no slot ever freed, a prior of 2,000 tokens/s (cap
    1,000 at SLO 1 s): behind 300 outstanding tokens a ~770-token prompt is paced, waits
    (300 + 770 − 1,000) ÷ 2,000 s for room plus 770 ÷ 2,000 s of its own prefill, within
    the 1 s budget: it queues, and is placed once the prefill ahead of it is done; behind
    5,000 it would take 2.4 s: refused at once."""
    r = rig(urls=(A,), metrics=EngineMetrics(running=1.0, waiting=0.0, kv_cache_usage=0.1),
            ttft_s=1.0)
    r.admission = Admission(AdmissionConfig(1000.0, 256, 30.0), SloPolicy(
        {"m": ModelSlo(Bounds(ttft_s=1.0))}), r.registry.snapshot, None, r.clock,
        prefill_priors={"p": 2000.0})
    r.admission.capacities()
    ahead = r.admission.prefill_started(A, outstanding)
    ask, route = _long_route(r, " ".join(f"word{i}" for i in range(400)))
    task = asyncio.create_task(r.admission.place(r.state, ask, route))
    for _ in range(100):
        await asyncio.sleep(0)
    if not queued:
        with pytest.raises(GatewayError):
            await task
        return
    assert r.admission.waiting("p") == 1 and not task.done()
    r.admission.prefill_done(A, outstanding, ahead, engine_ttft_s=0.2)
    placed, _ = await asyncio.wait_for(task, 10)
    assert placed is not None and placed.reservations[0].endpoint == A

"""MFU and MBU per endpoint and per pool, computed at scrape time from two sources.

``source="ridge"``: ridge's own accounting (:class:`TokenLedger`): every finished request's
tokens priced with :mod:`routing.formulas` and its pool's model facts (FLOPs, KV bytes read and
written, weights read once per engine step, steps counted by
:class:`gateway.telemetry.engine_steps.StepCounter`), the work placed in time and summed over
the last ``window_s`` [s] (:data:`WINDOW_S`). ``source="engine"``: the engine's own
cumulative estimates, where its dialect maps them (:class:`EngineHistory`; a total still at 0
means the engine does not estimate, a total that went down restarts the history).

:class:`EfficiencyCollector` exports achieved ÷ peak per endpoint and per pool, the estimated
totals as counters and the hardware facts; :func:`pool_ratios` is the one Σ achieved ÷ Σ peak,
:func:`pool_utilisation` ridge's pool figures straight from a ledger. A pool without model or
hardware facts has none of them (:func:`endpoint_facts` logs it once).
See docs/telemetry.md#mfu-and-mbu-accounting.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from config.fleet import Fleet
from gateway.telemetry.engine_steps import StepCounter
from routing import formulas as fleet_math
from routing.formulas import HardwareRates, ModelShape, RequestTokens, request_cost, utilisation
from routing.native_value import NativeValue
from routing.snapshots import EngineMetrics, PoolSnapshot
from routing.values import value

logger = logging.getLogger(__name__)

RIDGE = "ridge"
ENGINE = "engine"
WINDOW_S = 30.0
"""The MFU/MBU gauges' window [s] (module docstring)."""

PREFILL_SHARES_DECODE_STEPS: Mapping[str, bool] = MappingProxyType({
    "vllm": True,     # prefill chunks ride in the same steps as running decodes
    "sglang": False,  # prefill-first: a step is prefill-only or decode-only
})
"""Whether an engine's prefill joins the running decodes' step (then it reads no extra
weights when it arrives during a decode) — per engine, as data."""


@dataclass(frozen=True, slots=True)
class EndpointFacts:
    """What pricing one endpoint's work needs: its pool, engine, model shape and peak rates
    (FLOP/s, B/s), and the prefill chunk size (tokens; None = whole prompts)."""

    url: str
    pool: str
    engine: str
    shape: ModelShape
    rates: HardwareRates
    chunk: int | None = None


def endpoint_facts(fleet: Fleet) -> dict[str, EndpointFacts]:
    """Facts of every endpoint of ``fleet``, by URL; a pool without model or hardware facts is
    left out, with one log line saying so."""
    out: dict[str, EndpointFacts] = {}
    for pool in fleet.pools:
        if pool.model is None or pool.hardware is None:
            logger.info("pool %r: MFU/MBU off, the fleet file gives no %s facts", pool.name,
                        " and no ".join(pool.missing_facts()))
            continue
        chunked = pool.levers.chunked_prefill
        chunk = chunked.token_budget if chunked and chunked.enabled else None
        for url in pool.endpoint_urls():
            out[url] = EndpointFacts(url, pool.name, pool.engine.value, pool.model.to_shape(),
                                     pool.hardware.to_rates(), chunk)
    return out


class Work(NativeValue):
    """Work done evenly over [start, end] (an instant when equal). Units: FLOP, bytes."""

    FIELDS = ("start", "end", "flops", "read", "write")
    __slots__ = FIELDS

    def __init__(self, start: float, end: float, flops: float, read: float,
                 write: float) -> None:
        self.start: Final = start
        self.end: Final = end
        self.flops: Final = flops
        self.read: Final = read
        self.write: Final = write

    def share_in(self, lo: float, hi: float) -> float:
        """The fraction of this work done inside [lo, hi]."""
        if self.end <= self.start:
            return 1.0 if lo <= self.start <= hi else 0.0
        overlap = min(hi, self.end) - max(lo, self.start)
        return max(0.0, overlap) / (self.end - self.start)


@value
class Totals:
    """Work totals (FLOP, bytes read, bytes written), or rates of them (per second)."""

    flops: float = 0.0
    read: float = 0.0
    write: float = 0.0

    def plus(self, other: Totals, scale: float = 1.0) -> Totals:
        return Totals(self.flops + scale * other.flops, self.read + scale * other.read,
                      self.write + scale * other.write)

    def scaled(self, factor: float) -> Totals:
        return Totals(self.flops * factor, self.read * factor, self.write * factor)


@dataclass(slots=True)
class _EndpointAccount:
    """One endpoint's priced work in the window, its step counter and its totals since start
    (FLOP, bytes read, bytes written: plain numbers, added to in place)."""

    work: deque[Work]
    steps: StepCounter
    flops: float = 0.0
    read: float = 0.0
    write: float = 0.0


class TokenLedger:
    """ridge's per-endpoint work accounting (see the module docstring)."""

    def __init__(self, facts: Mapping[str, EndpointFacts], *, window_s: float = WINDOW_S,
                 max_items: int = 20_000, clock: Callable[[], float] = time.monotonic) -> None:
        self._facts = dict(facts)  # a dict: read for every request priced
        self.facts: Mapping[str, EndpointFacts] = MappingProxyType(self._facts)
        self.window_s = window_s
        self._clock = clock
        self._since = clock()
        self.began: float | None = None
        """When the first request priced arrived (None: none yet)."""
        self._accounts = {
            url: _EndpointAccount(deque(maxlen=max_items), StepCounter(
                PREFILL_SHARES_DECODE_STEPS.get(f.engine, False), horizon_s=10 * window_s))
            for url, f in facts.items()
        }

    def observe(self, url: str, tokens: RequestTokens, e2e_s: float, ttft_s: float | None,
                *, gaps: Sequence[float] = (), decode_url: str | None = None,
                at: float | None = None) -> None:
        """Price one finished request served by ``url`` (decoded on ``decode_url`` when a
        prefill/decode pair served it), finished at ``at`` (default: now); ``gaps``: its
        stream's inter-token gaps [s], when measured (they make the step count exact)."""
        end = self._clock() if at is None else at
        decode_url = decode_url or url
        if url not in self._accounts or decode_url not in self._accounts:
            return
        if self.began is None or end - e2e_s < self.began:
            self.began = end - e2e_s
        first = end - e2e_s + (ttft_s if ttft_s is not None else 0.0)
        self._price(url, decode_url, tokens, (min(first, end), end), gaps)

    def _price(self, url: str, decode_url: str, tokens: RequestTokens,
               span: tuple[float, float], gaps: Sequence[float]) -> None:
        first, end = span
        facts, decode_facts = self._facts[url], self._facts[decode_url]
        cost = request_cost(facts.shape, tokens, facts.chunk)
        prefill_steps = self._accounts[url].steps.prefill_steps(first, tokens)
        decode_steps = self._accounts[decode_url].steps.decode_steps(first, end, tokens, gaps)
        self._add(url, Work(first, first, cost.prefill_flops,
                            cost.prefill_kv_read + prefill_steps * facts.shape.weight_bytes,
                            cost.prefill_kv_write))
        self._add(decode_url, Work(first, end, cost.decode_flops, cost.decode_kv_read,
                                   cost.decode_kv_write))
        weights = decode_facts.shape.weight_bytes
        for run in decode_steps:
            self._add(decode_url, Work(run.start, run.end, 0.0, run.steps * weights, 0.0))

    def _add(self, url: str, work: Work) -> None:
        account = self._accounts[url]
        account.work.append(work)
        account.flops += work.flops
        account.read += work.read
        account.write += work.write

    def now(self) -> float:
        """The ledger's clock (seconds)."""
        return self._clock()

    def totals(self, url: str) -> Totals:
        """Everything priced on ``url`` since start (FLOP, bytes)."""
        account = self._accounts[url]
        return Totals(account.flops, account.read, account.write)

    def rates(self, url: str, now: float | None = None, since: float | None = None) -> Totals:
        """Achieved FLOP/s and B/s on ``url`` over the window ending ``now``, starting no
        earlier than ``since`` (default: when the ledger started)."""
        now = self._clock() if now is None else now
        account = self._accounts[url]
        while account.work and account.work[0].end < now - self.window_s:
            account.work.popleft()
        lo = max(now - self.window_s, self._since if since is None else since)
        done = Totals()
        for work in account.work:
            done = done.plus(Totals(work.flops, work.read, work.write), work.share_in(lo, now))
        return done.scaled(1.0 / max(1e-9, now - lo))


@dataclass(slots=True)
class EngineHistory:
    """Samples (time, cumulative engine totals) of one endpoint within the window."""

    samples: deque[tuple[float, Totals]] = field(default_factory=deque)

    def add(self, now: float, totals: Totals, window_s: float) -> None:
        if self.samples and _went_down(self.samples[-1][1], totals):
            self.samples.clear()
        self.samples.append((now, totals))
        while len(self.samples) > 2 and self.samples[1][0] <= now - window_s:
            self.samples.popleft()

    def rate(self) -> Totals | None:
        """(newest − oldest) ÷ elapsed, or None with fewer than two samples."""
        if len(self.samples) < 2:
            return None
        (t0, a), (t1, b) = self.samples[0], self.samples[-1]
        if t1 <= t0:
            return None
        return b.plus(a, -1.0).scaled(1.0 / (t1 - t0))


def _went_down(old: Totals, new: Totals) -> bool:
    return new.flops < old.flops or new.read < old.read or new.write < old.write


def engine_totals(metrics: EngineMetrics) -> Totals | None:
    """The engine's cumulative estimates, or None when its dialect has none."""
    flops = metrics.estimated_flops_total
    if flops is None:
        return None
    return Totals(flops, metrics.estimated_read_bytes_total or 0.0,
                  metrics.estimated_write_bytes_total or 0.0)


@dataclass(frozen=True, slots=True)
class EfficiencyReading:
    """One endpoint's achieved rates from one source, with the endpoint's facts."""

    facts: EndpointFacts
    source: str
    rates: Totals
    totals: Totals

    @property
    def mfu(self) -> float:
        return fleet_math.mfu(self.rates.flops, self.facts.rates)

    @property
    def mbu(self) -> float:
        return fleet_math.mbu(self.rates.read + self.rates.write, self.facts.rates)


Snapshot = Callable[[], Sequence[PoolSnapshot]]


class EfficiencyCollector(Collector):
    """Computes the MFU/MBU gauges and work counters at each scrape (see the module)."""

    def __init__(self, ledger: TokenLedger, snapshot: Snapshot) -> None:
        self._ledger = ledger
        self._snapshot = snapshot
        self._history: dict[str, EngineHistory] = {}
        self._first: float | None = None

    def readings(self) -> list[EfficiencyReading]:
        """Both sources' readings for every endpoint that has them, now. Both cover the
        window, or while that is longer the time since the first scrape — ridge's from the
        first request's arrival when that came earlier (module docstring)."""
        now = self._ledger.now()
        first = self._first = now if self._first is None else self._first
        began = self._ledger.began
        since = first if began is None else min(first, began)
        out = [EfficiencyReading(f, RIDGE, self._ledger.rates(url, now, since),
                                 self._ledger.totals(url))
               for url, f in self._ledger.facts.items()]
        for pool in self._snapshot():
            for ep in pool.endpoints:
                reading = self._engine_reading(ep.url, ep.metrics, now)
                if reading is not None:
                    out.append(reading)
        return out

    def _engine_reading(self, url: str, metrics: EngineMetrics,
                        now: float) -> EfficiencyReading | None:
        facts = self._ledger.facts.get(url)
        totals = engine_totals(metrics)
        if facts is None or totals is None:
            return None
        history = self._history.setdefault(url, EngineHistory())
        history.add(now, totals, self._ledger.window_s)  # zeros too: the baseline counts
        rates = history.rate()
        if rates is None or totals.flops <= 0:  # still 0: the engine does not estimate
            return None
        return EfficiencyReading(facts, ENGINE, rates, totals)

    def collect(self) -> Iterator[Metric]:
        readings = self.readings()
        yield from _endpoint_families(readings)
        yield from _pool_families(readings)
        yield from _fact_families(self._ledger.facts.values())


_EP_LABELS = ("pool", "endpoint", "source")


def _endpoint_families(readings: Iterable[EfficiencyReading]) -> Iterator[Metric]:
    mfu = GaugeMetricFamily("ridge_mfu_ratio", "Model FLOPs utilisation: achieved FLOP/s over "
                            "the window ÷ peak FLOP/s", labels=_EP_LABELS)
    mbu = GaugeMetricFamily("ridge_mbu_ratio", "Memory bandwidth utilisation: achieved bytes/s "
                            "(read + written) over the window ÷ memory bandwidth",
                            labels=_EP_LABELS)
    flops = CounterMetricFamily("ridge_estimated_flops", "Estimated FLOPs done", labels=_EP_LABELS)
    read = CounterMetricFamily("ridge_estimated_read_bytes", "Estimated bytes read from memory",
                               labels=_EP_LABELS)
    write = CounterMetricFamily("ridge_estimated_write_bytes", "Estimated bytes written to "
                                "memory", labels=_EP_LABELS)
    for r in readings:
        labels = [r.facts.pool, r.facts.url, r.source]
        mfu.add_metric(labels, r.mfu)
        mbu.add_metric(labels, r.mbu)
        flops.add_metric(labels, r.totals.flops)
        read.add_metric(labels, r.totals.read)
        write.add_metric(labels, r.totals.write)
    yield from (mfu, mbu, flops, read, write)


def pool_ratios(
        readings: Iterable[EfficiencyReading]) -> dict[tuple[str, str], tuple[float, float]]:
    """(pool, source) → (MFU, MBU) = Σ achieved ÷ Σ peak over the pool's readings."""
    achieved: dict[tuple[str, str], Totals] = {}
    peaks: dict[tuple[str, str], tuple[float, float]] = {}
    for r in readings:
        key = (r.facts.pool, r.source)
        achieved[key] = achieved.get(key, Totals()).plus(r.rates)
        flops, bandwidth = peaks.get(key, (0.0, 0.0))
        peaks[key] = (flops + r.facts.rates.peak_flops, bandwidth + r.facts.rates.mem_bandwidth)
    return {key: (utilisation(rates.flops, peaks[key][0]),
                  utilisation(rates.read + rates.write, peaks[key][1]))
            for key, rates in achieved.items()}


def pool_utilisation(ledger: TokenLedger, now: float | None = None
                     ) -> dict[str, tuple[float, float]]:
    """Per pool, ridge's own (MFU, MBU) over the ledger's window ending ``now`` (default: the
    ledger's clock), from the first request priced on (:func:`pool_ratios`)."""
    now = ledger.now() if now is None else now
    since = now if ledger.began is None else ledger.began
    readings = [EfficiencyReading(f, RIDGE, ledger.rates(url, now, since), ledger.totals(url))
                for url, f in ledger.facts.items()]
    return {pool: ratios for (pool, _), ratios in pool_ratios(readings).items()}


def _pool_families(readings: Iterable[EfficiencyReading]) -> Iterator[Metric]:
    mfu = GaugeMetricFamily("ridge_pool_mfu_ratio", "Pool MFU: Σ achieved FLOP/s ÷ Σ peak over "
                            "the pool's endpoints", labels=("pool", "source"))
    mbu = GaugeMetricFamily("ridge_pool_mbu_ratio", "Pool MBU: Σ achieved bytes/s ÷ Σ memory "
                            "bandwidth over the pool's endpoints", labels=("pool", "source"))
    for key, (pool_mfu, pool_mbu) in sorted(pool_ratios(readings).items()):
        mfu.add_metric(list(key), pool_mfu)
        mbu.add_metric(list(key), pool_mbu)
    yield from (mfu, mbu)


def _fact_families(facts: Iterable[EndpointFacts]) -> Iterator[Metric]:
    peak = GaugeMetricFamily("ridge_hardware_peak_flops_per_second", "Peak dense FLOP/s of one "
                             "accelerator of the pool (fleet file)", labels=("pool",))
    bandwidth = GaugeMetricFamily("ridge_hardware_memory_bandwidth_bytes_per_second", "Memory "
                                  "bandwidth of one accelerator of the pool (fleet file)",
                                  labels=("pool",))
    seen: set[str] = set()
    for f in facts:
        if f.pool not in seen:
            seen.add(f.pool)
            peak.add_metric([f.pool], f.rates.peak_flops)
            bandwidth.add_metric([f.pool], f.rates.mem_bandwidth)
    yield from (peak, bandwidth)

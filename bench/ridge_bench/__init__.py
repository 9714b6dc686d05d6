"""Benchmarks of ridge (not tests), a distribution of their own (ridge-bench) that depends on
ridge and adds the ``ridge bench`` command through the entry-point group ``ridge.commands``;
ridge never imports it.

- :mod:`ridge_bench.command`: ``ridge bench --workload ...`` replays a named workload against a
  gateway and reports goodput; ``ridge bench overhead`` runs :mod:`ridge_bench.overhead.benchmark`.
- :mod:`ridge_bench.compare.benchmark`: the router comparison on simulated fleets
  (``docs/benchmarks/router.md``).
- :mod:`ridge_bench.overhead.benchmark`: what a gateway costs per request and per streamed chunk
against a
  near-zero-cost engine stand-in, next to bare pass-throughs and the SGLang router
  (``docs/benchmarks/overhead.md``).
- :mod:`ridge_bench.overhead.state_latency`: what sharing the router state in Redis adds per
request.
"""

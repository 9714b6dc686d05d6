"""Precise prefix routing on real engines: ridge following the engines' KV-cache events beside
vLLM's router ``kv_aware`` (and round robin) in front of the same two vLLM CPU engines.

:mod:`~ridge_bench.precise.workload` is the traffic, :mod:`~ridge_bench.precise.engines` the
engine pair, :mod:`~ridge_bench.precise.contenders` how each router is configured,
:mod:`~ridge_bench.precise.benchmark` the run and :mod:`~ridge_bench.precise.doc` its page.
See docs/benchmarks/precise.md.
"""

"""Benchmarks of ridge (not tests): each module runs with ``python -m bench.<name>``.

- :mod:`bench.transport`: ridge's upstream transports (aiohttp, httpx, and httpx-aiohttp as a
  candidate) against a fast fake engine (:mod:`bench.upstream`), and the delay ridge's relay
  adds to a paced stream with and without TCP_NODELAY. Writes ``docs/benchmarks/transport.md``.
"""

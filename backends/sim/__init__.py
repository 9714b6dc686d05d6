"""A simulator of vLLM and SGLang engines: their HTTP API on the wire, their GPUs in time.

Each simulated endpoint is an aiohttp server speaking the engine's OpenAI API, health and metrics
exactly as the engine does, in front of an engine loop (continuous batching, a block KV cache with
prefix caching and preemption, chunked prefill, speculative decoding, prefill/decode hand-off)
whose step times come from the roofline of the pool's model and hardware facts. ``start_fleet``
starts every endpoint of a fleet file in this process; ``python -m backends.sim --config FILE``
does the same from a shell. See docs/simulator.md.
"""

from backends.sim.fleet import RunningFleet, SimServer, start_fleet

__all__ = ["RunningFleet", "SimServer", "start_fleet"]

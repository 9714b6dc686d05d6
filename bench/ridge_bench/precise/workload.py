"""The traffic of the precise-routing run: shared-prefix multi-turn sessions sized for the
real SmolLM2 CPU engines.

The router benchmark's agent conversations (:func:`ridge_bench.harness.workloads.agent_source`:
system prompts of instructions and tool schemas shared by many sessions, each session growing
turn by turn with tool results and the engine's own replies), scaled down so the longest turn
stays within the engines' 2,048-token context: :data:`SYSTEMS` system prompts of ~470–610 real
tokens (3–4 whole 128-token blocks of the CPU engines), 3 to 5 turns, tool results of 60–110
estimated tokens, replies of 16–32 tokens. Prompts average ~900 real tokens, the longest
~1,450 (the real tokenizer counts this text at ~1.4 × the 4-characters estimate). Open-loop
Poisson arrivals at one rate (:class:`~ridge_bench.harness.workloads.LoadStep`), fixed by the
seed like every workload, so each router gets the same requests in the same order.
"""

from __future__ import annotations

from dataclasses import replace

from ridge_bench.harness.workloads import AGENT, LoadStep, Workload, agent_source

SYSTEMS = 3
SYSTEM_TOKENS = 320  # estimated tokens of prose per system prompt
TOOL_TOKENS = 160  # estimated tokens of tool schemas per system prompt
NAME = "shared-prefix sessions"


def shared_prefix_workload(seed: int, rate: float, duration_s: float) -> Workload:
    """The sessions above at ``rate`` requests/s for ``duration_s`` seconds."""
    if rate <= 0 or duration_s <= 0:
        raise ValueError("rate and duration must be positive")
    source = replace(agent_source(seed, SYSTEMS, SYSTEM_TOKENS, TOOL_TOKENS), turns=(3, 5),
                     task_tokens=(30, 60), result_tokens=(60, 110), max_tokens=(16, 32))
    return Workload(NAME, seed, {AGENT: source}, {AGENT: 1.0}, (LoadStep(rate, duration_s),))

"""Which launch recipe starts which engine: the table deployments look engines up in.

:data:`LAUNCHERS` maps each :class:`config.engines.Engine` to its
:class:`backends.launch.args.Launcher` (:mod:`backends.launch.vllm`,
:mod:`backends.launch.sglang`), so code that renders deployments never branches on an
engine's name. :func:`checkpoint` is what a pool's engines load.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from backends.launch import sglang as sglang_launch
from backends.launch import vllm as vllm_launch
from backends.launch.args import Launcher
from config.engines import Engine
from config.pools import Pool

LAUNCHERS: Mapping[Engine, Launcher] = MappingProxyType({
    Engine.VLLM: vllm_launch.LAUNCHER,
    Engine.SGLANG: sglang_launch.LAUNCHER,
})  # fmt: skip
"""Engine → its launch recipe."""


def launcher(pool: Pool) -> Launcher:
    """The launch recipe of ``pool``'s engine."""
    return LAUNCHERS[pool.engine]


def checkpoint(pool: Pool) -> str:
    """What the pool's engines load: its ``checkpoint``, else its first model name (a Hugging
    Face id such as ``meta-llama/Llama-3.1-8B-Instruct`` is both)."""
    return pool.checkpoint or pool.models[0]

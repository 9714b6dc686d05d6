"""backends.launch.recipes: every engine has a launch recipe; what a pool's engines load."""

from __future__ import annotations

from backends.launch.recipes import LAUNCHERS, checkpoint, launcher
from config.engines import Engine
from config.pools import Pool

FACTS = {"params": 1e9, "layers": 2, "hidden_size": 64, "kv_heads": 1, "head_dim": 64,
         "dtype_bytes": 2}


def _pool(engine: str, **more: object) -> Pool:
    return Pool.model_validate({"name": "p", "engine": engine, "models": ["org/m", "alias"],
                                "endpoints": ["http://h:1"], "model": FACTS,
                                "hardware": {"peak_flops": 1, "mem_bandwidth": 1}, **more})


def test_every_engine_has_a_launcher() -> None:
    assert set(LAUNCHERS) == set(Engine)
    command = launcher(_pool("sglang")).command("python3", _pool("sglang"), "::", 1, "org/m")
    assert command[:3] == ["python3", "-m", "sglang.launch_server"]
    assert launcher(_pool("vllm")).port == 8000 and launcher(_pool("sglang")).port == 30000


def test_checkpoint_defaults_to_the_first_model() -> None:
    assert checkpoint(_pool("vllm")) == "org/m"
    assert checkpoint(_pool("vllm", checkpoint="/models/m")) == "/models/m"

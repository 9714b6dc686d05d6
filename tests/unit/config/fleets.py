"""The fleet-file tests' shared pool: a minimal pool with full model and hardware facts."""

from __future__ import annotations

from typing import Any

FACTS = {"params": 1e9, "layers": 2, "hidden_size": 8, "kv_heads": 1, "head_dim": 8,
         "dtype_bytes": 2}
HW = {"peak_flops": 1e12, "mem_bandwidth": 1e11}


def pool(**over: Any) -> dict[str, Any]:
    return {"name": "p", "engine": "vllm", "models": ["m"], "endpoints": ["http://h:1"],
            "model": FACTS, "hardware": HW, **over}

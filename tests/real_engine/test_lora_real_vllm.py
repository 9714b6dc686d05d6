"""LoRA on the real vLLM CPU build: a pool's adapter rendered into the launch flags
(``--enable-lora --lora-modules NAME=PATH --max-lora-rank 8``), served by vLLM, learned by
ridge from the engine's ``/v1/models`` and reached through ridge by its name.

The adapter is made here, for SmolLM2-135M's shapes, in the PEFT layout vLLM's loader reads
(``vllm/lora/utils.py`` ``parse_fine_tuned_lora_name``): ``adapter_config.json`` (r = 8,
``q_proj`` and ``v_proj``) and ``adapter_model.safetensors`` holding
``base_model.model.model.layers.{i}.self_attn.{q,v}_proj.lora_{A,B}.weight``, A as
[r, hidden] and B as [out, r]. B is all zeros, so the adapter adds nothing: its answers must
be the base model's, word for word, at temperature 0.

This module starts its own single engine and stops it at the end; it sorts before the tier's
shared engines start (as ``test_demo_real.py`` does), so at most two engines are ever up.
"""

from __future__ import annotations

import json
import random
import struct
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.real_engine.prompts import CAPITAL_ANSWER, CAPITAL_QUESTION, user
from tests.real_engine.servers import (
    MissingEngines,
    Server,
    StartupError,
    engine_paths,
    free_port,
    one_engine_and_ridge,
    pool_entry,
)

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(600)]

MODEL = "smollm2-135m"
ADAPTER = "tiny-lora"
RANK = 8
LAYERS, HIDDEN, HEAD_DIM, HEADS, KV_HEADS = 30, 576, 64, 9, 3
OUT = {"q_proj": HEADS * HEAD_DIM, "v_proj": KV_HEADS * HEAD_DIM}


def _safetensors(tensors: dict[str, tuple[list[int], list[float]]]) -> bytes:
    """float32 tensors (shape, row-major values) in the safetensors format: an 8-byte
    little-endian header length, the JSON header, then the data."""
    header: dict[str, object] = {}
    data = bytearray()
    for name, (shape, values) in tensors.items():
        raw = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    return struct.pack("<Q", len(text)) + text + bytes(data)


def make_adapter(folder: Path, base: str) -> Path:
    """A rank-8 LoRA of SmolLM2-135M on q_proj and v_proj whose B matrices are zero."""
    rng = random.Random(0)
    tensors = {}
    for layer in range(LAYERS):
        for module, out in OUT.items():
            key = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{key}.lora_A.weight"] = (
                [RANK, HIDDEN], [rng.uniform(-0.01, 0.01) for _ in range(RANK * HIDDEN)])
            tensors[f"{key}.lora_B.weight"] = ([out, RANK], [0.0] * (out * RANK))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_model.safetensors").write_bytes(_safetensors(tensors))
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": RANK, "lora_alpha": 16,
              "lora_dropout": 0.0, "bias": "none", "target_modules": list(OUT),
              "base_model_name_or_path": base, "fan_in_fan_out": False,
              "modules_to_save": None, "use_rslora": False, "use_dora": False}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Server]]:
    """One vLLM engine with the adapter, and ridge in front of it: (engine, ridge)."""
    try:
        base = engine_paths().model_dir
        adapter = make_adapter(tmp_path_factory.mktemp("adapter") / ADAPTER, str(base))
        entry = pool_entry("lora", [MODEL], [free_port()], {})
        entry["adapters"] = [{"name": ADAPTER, "path": str(adapter), "rank": RANK}]
        with one_engine_and_ridge(entry, tmp_path_factory.mktemp("lora-logs")) as served:
            yield served
    except (MissingEngines, StartupError) as exc:
        pytest.fail(f"{type(exc).__name__}: {exc}", pytrace=False)


def test_the_engine_lists_the_adapter_with_its_base_model(
    served: tuple[Server, Server]
) -> None:
    engine, _ = served
    cards = {c["id"]: c for c in httpx.get(engine.url + "/v1/models", timeout=10).json()["data"]}
    assert cards[ADAPTER]["parent"] == MODEL and cards[MODEL]["parent"] is None


def test_chat_with_the_adapter_through_ridge(served: tuple[Server, Server]) -> None:
    _, ridge = served
    with openai.OpenAI(base_url=ridge.url + "/v1", api_key="unused", max_retries=0,
                       timeout=120) as client:
        listed = {m.id: m for m in client.models.list().data}
        assert getattr(listed[ADAPTER], "parent", None) == MODEL
        answers = {}
        for model in (ADAPTER, MODEL):
            reply = client.chat.completions.create(
                model=model, messages=user(CAPITAL_QUESTION), max_tokens=12, temperature=0)
            assert reply.model == model
            answers[model] = reply.choices[0].message.content
        assert answers[ADAPTER] == answers[MODEL]  # B = 0: the adapter changes nothing
        assert CAPITAL_ANSWER in (answers[ADAPTER] or "")
        with pytest.raises(openai.NotFoundError) as caught:
            client.chat.completions.create(model="other-lora", messages=user(CAPITAL_QUESTION),
                                           max_tokens=4)
        assert caught.value.code == "model_not_found"

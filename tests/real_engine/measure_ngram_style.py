"""Measure the real n-gram engine and fit the simulator's answer style to it.

Run from the repository root (after the real engines are installed)::

    .venv/bin/python -m tests.real_engine.measure_ngram_style [--dry-run]

Starts one engine like the real-demo fleet's ``spec`` pool (n-gram speculation, K = 4) and,
after it, one without speculation, and sends each the calibration requests below, one at a
time: greedy, streamed, natural stops, ``max_tokens`` 300 (and the free-text questions
again with 96: a small model repeats itself more the longer it writes). From the speculating
engine it keeps each request's ``vllm:spec_decode_*`` counter deltas, and from both the decode
rates.
Writes ``backends/sim/profiles/ground_truth_ngram.json`` (prompt tokens as the model's own
token texts, so the fit needs no tokenizer), fits the answer style
(:func:`backends.sim.style_fit.fit_style`) and prints the ``simulator:`` knobs for the fleet
file. These requests are the calibration set: the fidelity report
(``ridge bench fidelity``) verifies with others.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from openai import OpenAI

from backends.sim.style_fit import SHORT, fitted
from tests.real_engine.scrape import totals
from tests.real_engine.servers import (
    ROOT,
    engine_paths,
    free_port,
    pool_entry,
    real_fleet,
    start_vllm_pools,
    stop_all,
)
from tests.real_engine.timing import stream_chat

OUT = ROOT / "backends" / "sim" / "profiles" / "ground_truth_ngram.json"
MODEL = "smollm2-135m"
MAX_TOKENS = 300
SPEC = {"speculative": {"method": "ngram", "num_draft_tokens": 4}}
COUNTERS = ("drafts", "draft_tokens", "accepted")

CODES = (
    "\n".join(f"def step_{i}(state, rate):\n    value = state.get('v{i}', 0) * rate + {i}\n"
              "    return value" for i in range(6)),
    "\n".join(f"    items[{i}] = normalise(raw[{i}], scale={i + 1}, clip=True)"
              for i in range(12)),
    "\n".join(f"SELECT name, total_{i} FROM orders_{i} WHERE region = 'north' AND year = "
              f"{2000 + i};" for i in range(8)),
)
CHATS = ("Tell me about the history of tea in three paragraphs.",
         "Why do cats purr? Explain in detail.",
         "Describe a walk through a forest in autumn.")
REQUESTS: tuple[tuple[str, str, int], ...] = (
    *(("chat", c, SHORT) for c in CHATS),
    *(("chat", c, MAX_TOKENS) for c in CHATS),
    *(("copy", "Repeat the following code exactly:\n" + c, MAX_TOKENS) for c in CODES),
)


def _counters(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    names = {"drafts": "vllm:spec_decode_num_drafts_total",
             "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
             "accepted": "vllm:spec_decode_num_accepted_tokens_total"}
    return {k: after.get(n, 0.0) - before.get(n, 0.0) for k, n in names.items()}


def _measure(levers: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every calibration request on one fresh engine with ``levers``."""
    port = free_port()
    fleet, _ = real_fleet([pool_entry("calibration", [MODEL], [port], levers)])
    servers = start_vllm_pools(fleet.pools, engine_paths(), Path(tempfile.mkdtemp()), [None])
    url = f"http://127.0.0.1:{port}"
    rows: list[dict[str, Any]] = []
    try:
        client = OpenAI(base_url=url + "/v1", api_key="unused")
        for kind, content, max_tokens in REQUESTS:
            before = totals(url)
            result = stream_chat(client, MODEL, [{"role": "user", "content": content}],
                                 max_tokens)
            rows.append({"kind": kind, "content": content, "result": result,
                         **_counters(before, totals(url))})
    finally:
        stop_all(servers)
    return rows


def _pieces(content: str) -> list[str]:
    """The prompt as the model's token texts (its tokenizer and chat template)."""
    from routing.tokens.exact import load_prompt_tokenizer

    tokenizer = load_prompt_tokenizer(str(engine_paths().model_dir))
    ids = tokenizer.prompt_ids({"messages": [{"role": "user", "content": content}]}, "chat")
    assert ids is not None
    return [tokenizer.token_text(i) for i in ids]


def ground_truth(spec: Sequence[Mapping[str, Any]], plain: Sequence[Mapping[str, Any]],
                 out: Path = OUT) -> dict[str, Any]:
    cases = []
    for s, p in zip(spec, plain, strict=True):
        pieces = _pieces(s["content"])
        if len(pieces) != s["result"].prompt_tokens:
            raise SystemExit(f"prompt tokens differ from the engine's: {len(pieces)} vs "
                             f"{s['result'].prompt_tokens}")
        cases.append({"kind": s["kind"], "content": s["content"], "prompt_tokens": len(pieces),
                      "prompt_pieces": pieces, "answer_tokens": s["result"].completion_tokens,
                      **{k: s[k] for k in COUNTERS},
                      "spec_decode_tokens_per_s": round(s["result"].decode_tokens_per_s, 2),
                      "plain_decode_tokens_per_s": round(p["result"].decode_tokens_per_s, 2)})
    previous = json.loads(out.read_text()) if out.exists() else {}
    return {**previous, "cases": cases, "measured_on": f"{time.strftime('%Y-%m-%d')}, "
            f"{platform.processor() or platform.machine()}",
            "source": "tests/real_engine/measure_ngram_style.py"}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dry-run", action="store_true", help="print, do not write the file")
    parser.add_argument("--out", type=Path, default=OUT, help=f"where to write (default {OUT})")
    args = parser.parse_args(argv)
    truth = ground_truth(_measure(SPEC), _measure({}), args.out)
    if not args.dry_run:
        args.out.write_text(json.dumps(truth, indent=1, ensure_ascii=False) + "\n")
    print("simulator knobs for the n-gram pool's model:", json.dumps(fitted(truth)))


if __name__ == "__main__":
    main()

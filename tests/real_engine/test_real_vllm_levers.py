"""The levers work on the real engines, measured through ridge. Numbers are printed (``-s``).

- Prefix caching: a run of requests sharing a ~700-token system prompt (a fresh one each
  run, so the first request is cold) on the prefix-caching pool. The engine's
  ``vllm:prefix_cache_hits_total`` must rise by at least four 128-token blocks per later
  request, and the later requests' TTFT must be well below the first one's.
- Speculative decoding: a copy-heavy prompt ("repeat this code") on the n-gram pool decodes
  faster than on the plain pool, and the engine reports accepted draft tokens.

Each engine is pinned to its own core and the runs alternate, so the comparison is fair
on a two-core machine.
"""

from __future__ import annotations

import statistics
import uuid

import pytest
from openai import OpenAI

from tests.real_engine.conftest import PLAIN_MODEL, SPEC_MODEL, Engines
from tests.real_engine.prompts import COPY_PROMPT, shared_prefix_messages, user
from tests.real_engine.scrape import delta, totals
from tests.real_engine.timing import StreamResult, stream_chat

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(600)]

BLOCK_TOKENS = 128  # vLLM's KV block size on CPU (vllm:cache_config_info block_size)
QUESTIONS = (
    "How do I sharpen a spade?",
    "Which rake is best for leaves?",
    "How often should I oil my shears?",
    "What is a dibber used for?",
    "Can I leave a hose out in winter?",
    "How do I store a lawnmower?",
)
TTFT_RATIO_MAX = 0.5  # later TTFT / first TTFT
SPEEDUP_MIN = 1.3  # speculative decode rate / plain decode rate, copy-heavy prompt
COPY_TOKENS = 200  # enough for the whole copy (about 190 tokens)


def test_prefix_cache_hits_cut_ttft(client: OpenAI, engines: Engines) -> None:
    nonce = f"Session {uuid.uuid4().hex[:12]}. "
    before = totals(engines.plain.url)
    runs = [
        stream_chat(client, PLAIN_MODEL, shared_prefix_messages(q, nonce), max_tokens=8)
        for q in QUESTIONS
    ]
    after = totals(engines.plain.url)
    hits = delta(before, after, "vllm:prefix_cache_hits_total")
    cached = delta(before, after, "vllm:prompt_tokens_cached_total")
    first, later = runs[0].ttft_s, statistics.median(r.ttft_s for r in runs[1:])
    print(f"\nprefix caching: {runs[0].prompt_tokens} prompt tokens, first TTFT {first:.3f} s, "
          f"later TTFT median {later:.3f} s ({later / first:.2f}x), "
          f"hits +{hits:.0f} tokens, cached prompt tokens +{cached:.0f}")
    assert hits >= 4 * BLOCK_TOKENS * (len(QUESTIONS) - 1)
    assert later < TTFT_RATIO_MAX * first


def _median_rate(results: list[StreamResult]) -> float:
    return statistics.median(r.decode_tokens_per_s for r in results)


def test_speculative_decoding_speeds_up_copying(client: OpenAI, engines: Engines) -> None:
    before = totals(engines.spec.url)
    plain: list[StreamResult] = []
    spec: list[StreamResult] = []
    for _ in range(3):
        plain.append(stream_chat(client, PLAIN_MODEL, user(COPY_PROMPT), max_tokens=COPY_TOKENS))
        spec.append(stream_chat(client, SPEC_MODEL, user(COPY_PROMPT), max_tokens=COPY_TOKENS))
    after = totals(engines.spec.url)
    drafted = delta(before, after, "vllm:spec_decode_num_draft_tokens_total")
    accepted = delta(before, after, "vllm:spec_decode_num_accepted_tokens_total")
    plain_rate, spec_rate = _median_rate(plain), _median_rate(spec)
    print(f"\nspeculative decoding (n-gram, K=4), copy prompt, {spec[0].completion_tokens} tokens: "
          f"plain {plain_rate:.1f} tok/s, spec {spec_rate:.1f} tok/s "
          f"({spec_rate / plain_rate:.2f}x); drafted {drafted:.0f}, accepted {accepted:.0f} "
          f"({accepted / max(drafted, 1):.0%}); same text: {plain[0].text == spec[0].text}")
    assert accepted > 0
    assert spec_rate > SPEEDUP_MIN * plain_rate

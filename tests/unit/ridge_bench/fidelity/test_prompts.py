"""The fidelity requests are not the calibration requests, and each run's cold prompts are its
own."""

from __future__ import annotations

from ridge_bench.fidelity import prompts as fp
from tests.real_engine import prompts as calibration


def _texts() -> list[str]:
    messages = [*fp.user(fp.SHORT_QUESTION), *fp.long_prompt("t", 0),
                *fp.shared_prefix(fp.library_prompt("t", 0), fp.PREFIX_QUESTIONS[0]),
                *fp.user(fp.COPY_PROMPT), *fp.user(fp.CHAT_QUESTION), *fp.story(0)]
    return [m["content"] for m in messages]


def test_no_calibration_text_is_reused() -> None:
    used = "\n".join(_texts())
    assert calibration.CAPITAL_QUESTION not in used
    assert calibration.COPY_CODE not in used
    assert not any(line in used for line in calibration.long_system_prompt().splitlines())


def test_cold_prompts_differ_by_tag_and_repeat() -> None:
    assert fp.long_prompt("a", 0) != fp.long_prompt("a", 1) != fp.long_prompt("b", 1)
    assert fp.library_prompt("a", 0) != fp.library_prompt("a", 1)


def test_the_copy_prompt_asks_for_a_copy_of_the_code() -> None:
    assert fp.COPY_PROMPT == "Repeat the following code exactly:\n" + fp.COPY_CODE
    assert len(fp.over_context()[0]["content"].split()) > 2048

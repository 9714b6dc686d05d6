"""gateway.cli.plan: the flags of ``ridge plan``, and what a bad one prints."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli.main import main
from gateway.cli.plan import parse_slo

TRACE = Path(__file__).resolve().parents[4] / "bench" / "ridge_bench" / "traces" / \
    "conversations.jsonl"


def test_an_slo_is_either_bound_or_both() -> None:
    assert parse_slo("ttft=2,tpot=0.05") == (2.0, 0.05)
    assert parse_slo("tpot=0.1") == (None, 0.1)
    assert parse_slo("") == (None, None)
    for bad in ("e2e=3", "ttft=0", "ttft=-1", "ttft"):
        with pytest.raises(ValueError, match="--slo"):
            parse_slo(bad)


@pytest.mark.parametrize(("flags", "says"), [
    (["--model", "no-such-model"], "no-such-model"),
    (["--slo", "ttft=fast"], "--slo ttft"),
    (["--recipes", "general,bogus"], "bogus"),
    (["--recipes", "spec-eagle-3"], "--draft-model"),
    (["--out", "/no/such/folder/fleet.yaml"], "no folder /no/such/folder"),
    (["--compare", "2,x"], "--compare: not a list of numbers"),
    (["--model", "llama-3.1-8b"], "no recipe can run: pool 'general': the KV cache holds"),
])
def test_a_bad_flag_is_one_line_and_status_2(
        flags: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    base = {"--trace": str(TRACE), "--gpus": "2", "--accelerator": "nvidia-l4",
            "--model": "llama-3-8b"}
    for i in range(0, len(flags), 2):
        base[flags[i]] = flags[i + 1]
    argv = ["plan", *[x for kv in base.items() for x in kv]]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0] and err[0].startswith("ridge plan: ")


def test_a_trace_that_is_not_a_trace_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 1}\n')
    assert main(["plan", "--trace", str(bad), "--gpus", "1", "--accelerator", "nvidia-l4",
                 "--model", "llama-3-8b"]) == 2
    assert "bad.jsonl:1" in capsys.readouterr().err

"""The fidelity doc: its tables from two sides, and rewriting only the generated section."""

from __future__ import annotations

from pathlib import Path

from ridge_bench.fidelity.doc import BEGIN, END, markdown, write_doc
from tests.unit.ridge_bench.fidelity.test_report import side

ERRORS = {"prompt over the context": {"status": 400, "type": "BadRequestError",
                                      "param": "input_tokens", "message": "too long"}}


def test_the_tables_show_both_sides_and_the_verdicts() -> None:
    real, sim = side(), side(chat_spec=40.0, tokens=51)
    real["errors"] = ERRORS
    sim["errors"] = {k: {**v, "message": "longer than the context"} for k, v in ERRORS.items()}
    text = markdown(real, sim, {"repeats": 2})
    assert text.startswith("_repeats: 2._")
    assert "| n-gram speed-up, chat: spec ÷ plain decode rate | 1.000 | 2.000 | 2.00 | FAIL |" \
        in text
    assert "| prefix cache: cached ÷ cold TTFT | 0.100 | 0.100 | 1.00 | pass |" in text
    assert "| short (2) | 50 | 51 | NO |" in text
    assert "| 4 | 0.10 / 0.30 / 0.40 / 0.60 | 0.10 / 0.30 / 0.40 / 0.60 |" in text
    assert "| copy | 0.90 / 0.80 / 0.70 / 0.60 | 0.90 / 0.80 / 0.70 / 0.60 |" in text
    assert ("| prompt over the context | 400, `BadRequestError`, `input_tokens` | "
            "400, `BadRequestError`, `input_tokens` | no |") in text
    assert "real “too long”; simulated “longer than the context”" in text


def test_write_replaces_only_the_generated_section(tmp_path: Path) -> None:
    doc = tmp_path / "fidelity.md"
    doc.write_text(f"# Fidelity\n\nhand-written\n\n{BEGIN}\nold\n{END}\n\nafter\n")
    write_doc(doc, "new")
    assert doc.read_text() == f"# Fidelity\n\nhand-written\n\n{BEGIN}\nnew\n{END}\n\nafter\n"


def test_a_doc_without_the_section_gets_it_appended(tmp_path: Path) -> None:
    doc = tmp_path / "fidelity.md"
    doc.write_text("# Fidelity\n")
    write_doc(doc, "table")
    assert doc.read_text() == f"# Fidelity\n\n{BEGIN}\ntable\n{END}\n"

from __future__ import annotations

from pathlib import Path

from ridge_bench.harness.doc_block import write_block


def test_only_the_block_is_rewritten(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("# Doc\n\nprose\n\n<!-- b -->\nold\n<!-- e -->\n\nafter\n")
    write_block(doc, "<!-- b -->", "<!-- e -->", "new")
    assert doc.read_text() == "# Doc\n\nprose\n\n<!-- b -->\nnew\n<!-- e -->\n\nafter\n"


def test_a_doc_without_the_markers_gets_the_block_appended(tmp_path: Path) -> None:
    doc = tmp_path / "docs" / "new.md"
    write_block(doc, "<b>", "<e>", "table")
    assert doc.read_text() == "<b>\ntable\n<e>\n"
    doc.write_text("# Doc\n\n")
    write_block(doc, "<b>", "<e>", "table")
    assert doc.read_text() == "# Doc\n\n<b>\ntable\n<e>\n"

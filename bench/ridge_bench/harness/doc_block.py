"""The generated block of a hand-written doc: the text between a begin and an end marker.

Every benchmark that writes its results into ``docs/benchmarks/`` keeps the prose around its
block and rewrites only the block; a doc without the markers gets the block appended.
"""

from __future__ import annotations

from pathlib import Path


def write_block(doc: Path, begin: str, end: str, text: str) -> None:
    """Put ``text`` between ``begin`` and ``end`` in ``doc`` (created with its folder if
    missing; the block appended after a blank line when the markers are not there)."""
    block = f"{begin}\n{text}\n{end}"
    old = doc.read_text() if doc.exists() else ""
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        new = head + block + rest.split(end, 1)[1]
    else:
        new = old.rstrip("\n") + ("\n\n" if old else "") + block + "\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(new)

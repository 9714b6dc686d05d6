"""One meaning per name: no two top-level classes of the product share a name, and none of the
benchmarks' classes share one among themselves (docs/architecture.md, "The layout")."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("gateway", "routing", "backends", "config")
BENCH = ("bench/ridge_bench",)


def classes(folders: tuple[str, ...], root: Path = ROOT) -> dict[str, list[str]]:
    """Each top-level class name in ``folders`` → the modules that define it."""
    found: dict[str, list[str]] = defaultdict(list)
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.ClassDef):
                    found[node.name].append(str(path.relative_to(root)))
    return found


def shared(found: dict[str, list[str]]) -> dict[str, list[str]]:
    return {name: where for name, where in found.items() if len(where) > 1}


@pytest.mark.parametrize("folders", [PRODUCT, BENCH], ids=["product", "benchmarks"])
def test_no_two_classes_share_a_name(folders: tuple[str, ...]) -> None:
    assert not shared(classes(folders)), "one name, one class; rename one of them"


def test_the_check_sees_two_classes_of_one_name(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "a").mkdir(parents=True)
    (tmp_path / "pkg" / "a" / "one.py").write_text("class Plan:\n    pass\n")
    (tmp_path / "pkg" / "two.py").write_text("class Plan:\n    pass\nclass Other:\n    pass\n")
    assert shared(classes(("pkg",), tmp_path)) == {"Plan": ["pkg/a/one.py", "pkg/two.py"]}

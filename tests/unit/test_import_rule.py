"""The import rule: routing is pure, backends may use routing, nothing imports gateway; the
benchmarks (ridge_bench, a distribution of their own under bench/) may import the product, the
product never imports them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FRAMEWORKS = {"fastapi", "starlette", "httpx", "aiohttp", "redis", "prometheus_client",
              "uvicorn", "pydantic", "pydantic_settings", "yaml"}
PROJECT = {"gateway", "routing", "backends"}
BENCH = {"ridge_bench", "bench"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("path", _modules("routing"), ids=lambda p: p.name)
def test_routing_imports_no_framework_and_no_other_package(path: Path) -> None:
    bad = _imports(path) & (FRAMEWORKS | (PROJECT - {"routing"}))
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


@pytest.mark.parametrize("path", _modules("backends"), ids=lambda p: p.name)
def test_backends_do_not_import_gateway(path: Path) -> None:
    assert "gateway" not in _imports(path), f"{path.relative_to(ROOT)} imports gateway"


@pytest.mark.parametrize("path", [m for p in sorted(PROJECT) for m in _modules(p)],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_the_product_does_not_import_the_benchmarks(path: Path) -> None:
    bad = _imports(path) & BENCH
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_the_benchmarks_live_in_their_own_distribution() -> None:
    assert (ROOT / "bench" / "pyproject.toml").is_file()
    assert not (ROOT / "bench" / "__init__.py").exists()
    assert _modules("bench/ridge_bench"), "no ridge_bench modules found"


def test_the_rule_sees_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import httpx\nfrom gateway.app import create_app\n")
    assert _imports(bad) == {"httpx", "gateway"}

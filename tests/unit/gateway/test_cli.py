from __future__ import annotations

import socket
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
from fastapi import FastAPI

from gateway import cli
from gateway.cli import listening_socket, main, uvicorn_config
from gateway.settings import Settings

CALLS: list[list[str]] = []


def fake_bench(argv: list[str]) -> int:
    """Stands in for an installed plugin command (loaded through its entry point)."""
    CALLS.append(argv)
    return 7


def _plugins(monkeypatch: pytest.MonkeyPatch, **commands: str) -> None:
    eps = {name: EntryPoint(name=name, value=value, group=cli.COMMANDS_GROUP)
           for name, value in commands.items()}
    monkeypatch.setattr(cli, "plugin_commands", lambda: eps)


def test_an_installed_plugin_command_runs_with_the_rest_of_argv(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _plugins(monkeypatch, bench=f"{__name__}:fake_bench")
    CALLS.clear()
    assert main(["bench", "overhead", "--rounds", "1"]) == 7
    assert CALLS == [["overhead", "--rounds", "1"]]


def test_a_missing_bench_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    _plugins(monkeypatch)
    assert main(["bench", "--workload", "agent"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ridge bench: not installed" in err[0]
    assert "pip install -e ./bench" in err[0] and "ridge-bench" in err[0]


def test_help_lists_installed_plugins(monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    _plugins(monkeypatch, bench=f"{__name__}:fake_bench", serve=f"{__name__}:fake_bench")
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "{bench,serve,demo,keys,render}" in out and "(ridge bench --help)" in out


def test_a_plugin_cannot_replace_a_builtin(monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    _plugins(monkeypatch, serve=f"{__name__}:fake_bench")
    monkeypatch.delenv("RIDGE_CONFIG", raising=False)
    assert main(["serve"]) == 2
    assert "no fleet file" in capsys.readouterr().err


def test_the_demo_fleets_ship_inside_the_package() -> None:
    for name in (cli.DEMO_FLEET, cli.REAL_DEMO_FLEET):
        fleet = cli._demo_fleet(None, name)
        assert fleet.pools and fleet.pools[0].models


def test_bad_fleet_file_stops_start_up_naming_file_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("pools:\n  - name: p\n    engine: vllm\n    models: [m]\n"
                     "    endpoints: [http://127.0.0.1:1]\n")
    assert main(["serve", "--config", str(fleet)]) == 2
    err = capsys.readouterr().err
    assert f"{fleet}: invalid fleet configuration" in err
    assert "pools.0.model: Field required" in err and "pools.0.hardware: Field required" in err


def test_missing_fleet_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml: cannot read" in capsys.readouterr().err


def test_serve_without_a_fleet_file(capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RIDGE_CONFIG", raising=False)
    assert main(["serve"]) == 2
    assert "no fleet file" in capsys.readouterr().err


def test_listening_socket_has_nodelay() -> None:
    sock = listening_socket("127.0.0.1", 0)
    try:
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        client = socket.create_connection(sock.getsockname())
        sock.setblocking(True)
        accepted, _ = sock.accept()
        # accepted connections inherit the option from the listening socket (Linux)
        assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        accepted.close()
        client.close()
    finally:
        sock.close()


@pytest.mark.parametrize(("keep_alive_s", "expected"), [(None, 75), (2.5, 3), (0.2, 1)])
def test_idle_connections_outlive_clients_pool_expiry(keep_alive_s: float | None,
                                                      expected: int) -> None:
    settings = Settings() if keep_alive_s is None else Settings(keep_alive_s=keep_alive_s)
    config = uvicorn_config(FastAPI(), settings)
    assert config.timeout_keep_alive == expected  # uvicorn's own default is 5 s
    assert config.lifespan == "on"

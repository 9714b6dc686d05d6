from __future__ import annotations

import socket
from pathlib import Path

import pytest
from fastapi import FastAPI

from gateway.cli import listening_socket, main, uvicorn_config
from gateway.settings import Settings


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

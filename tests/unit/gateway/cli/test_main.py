from __future__ import annotations

import argparse
import socket
from collections.abc import Iterator
from importlib.metadata import EntryPoint, version
from pathlib import Path

import pytest
from fastapi import FastAPI

from gateway import native
from gateway.app import RidgeApp
from gateway.cli import main as cli
from gateway.cli.main import listening_socket, main, uvicorn_config
from gateway.server.listeners import ListenError
from gateway.settings import Settings

DEMO_FLEET_FILE = Path(cli.__file__).parent.parent / "demo" / cli.DEMO_FLEET
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
    out = capsys.readouterr().out
    lines = [line.split() for line in out.splitlines()]
    listed = [words[0] for words in lines if words and words[0] in (*cli.BUILTIN, "bench")]
    assert listed == ["bench", "serve", "demo", "keys", "render", "plan"]
    assert "(ridge bench --help)" in " ".join(out.split())  # argparse may wrap the line


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
    fleet.write_text("pools:\n  - name: p\n    engine: tgi\n    models: [m]\n")
    assert main(["serve", "--config", str(fleet)]) == 2
    err = capsys.readouterr().err
    assert f"{fleet}: invalid fleet configuration" in err
    assert "pools.0.endpoints: Field required" in err and "pools.0.engine: " in err


def test_missing_fleet_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml: cannot read" in capsys.readouterr().err


def test_serve_without_a_fleet_file(capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RIDGE_CONFIG", raising=False)
    assert main(["serve"]) == 2
    assert "no fleet file" in capsys.readouterr().err


def test_serve_refuses_compiled_routing_older_than_its_source(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(native, "stale", lambda: ("routing.prefix_index",))
    assert main(["serve", "--config", str(tmp_path / "fleet.yaml")]) == 2
    err = capsys.readouterr().err
    assert "routing.prefix_index" in err and "make native" in err


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
    config = uvicorn_config(RidgeApp(FastAPI()), settings)
    assert config.timeout_keep_alive == expected  # uvicorn's own default is 5 s
    assert config.lifespan == "on"


def _all_parsers(parser: argparse.ArgumentParser,
                 path: str = "ridge") -> list[tuple[str, argparse.ArgumentParser]]:
    """``parser`` and every subcommand's parser under it, by command line."""
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found += _all_parsers(child, f"{path} {name}")
    return found


def test_every_command_has_a_description_and_every_flag_a_help(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _plugins(monkeypatch)
    parsers = _all_parsers(cli._parser({}))
    assert {p for p, _ in parsers} >= {"ridge", "ridge serve", "ridge demo", "ridge keys",
                                       "ridge keys add", "ridge keys list", "ridge keys revoke",
                                       "ridge render", "ridge render compose"}
    for path, parser in parsers:
        assert parser.description and "``" not in parser.description, path
        for action in parser._actions:
            if not isinstance(action, argparse._SubParsersAction):
                assert action.help, f"{path} {action.option_strings or action.dest}"


def test_help_describes_ridge_not_its_module(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    _plugins(monkeypatch)
    with pytest.raises(SystemExit) as stop:
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert stop.value.code == 0
    assert "OpenAI-compatible gateway" in out and "The ``ridge`` command" not in out
    assert "RIDGE_" in out and "--version" in out


@pytest.mark.parametrize("command", ["serve", "demo"])
def test_serve_and_demo_help_say_what_they_do(command: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "Run the gateway" in out and "RIDGE_PORT" in out


def test_version_comes_from_the_installed_package(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == f"ridge {version('ridge')}"


def _error_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()


@pytest.mark.parametrize(("argv", "env", "expected"), [
    (["--port", "99999"], {}, "ridge: --port 99999: must be less than or equal to 65535"),
    ([], {"RIDGE_PORT": "abc"},
     "ridge: RIDGE_PORT=abc: must be a valid integer, unable to parse string as an integer"),
    ([], {"RIDGE_UPSTREAM__TRANSPORT": "h3"},
     "ridge: RIDGE_UPSTREAM__TRANSPORT=h3: must be 'http1' or 'aiohttp'"),
    ([], {"RIDGE_LOG_LEVEL": "loud"}, "ridge: RIDGE_LOG_LEVEL=loud: must be one of critical, "
                                      "error, warning, info, debug, trace"),
    ([], {"RIDGE_CORS_ORIGINS": "*"}, 'ridge: RIDGE_CORS_ORIGINS=\'*\': must be a JSON list, '
                                      'e.g. ["a", "b"]'),
    (["--workers", "0"], {}, "ridge: --workers 0: must be greater than or equal to 1"),
])  # fmt: skip
def test_a_bad_setting_is_one_line_naming_flag_or_variable(
        argv: list[str], env: dict[str, str], expected: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["serve", *argv]) == 2
    assert _error_lines(capsys) == [expected]


def test_every_bad_setting_gets_its_line(monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("RIDGE_AUTH", "maybe")
    assert main(["demo", "--port", "-1"]) == 2
    lines = _error_lines(capsys)
    assert len(lines) == 2
    assert "ridge: --port -1: must be greater than or equal to 0" in lines
    assert "ridge: RIDGE_AUTH=maybe: must be 'auto', 'on' or 'off'" in lines


def test_an_unknown_flag_is_reported_by_its_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["serve", "--bogus"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "usage: ridge serve" in err
    assert "ridge serve: error: unrecognized arguments: --bogus" in err


@pytest.mark.parametrize("argv", [["--bogus"], ["--bogus", "serve"], ["-x=1"]])
def test_a_flag_before_any_command_is_named(argv: list[str],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    assert f"ridge: error: unknown flag {argv[0]}: flags go after the command" in \
        capsys.readouterr().err


def test_a_misspelt_variable_is_a_warning_naming_the_setting(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIDGE_PROT", "9000")
    assert main(["serve", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert _error_lines(capsys)[0] == ("ridge: warning: RIDGE_PROT is not a setting, so it is "
                                       "ignored; did you mean RIDGE_PORT?")


@pytest.mark.parametrize("speed", ["0", "-2", "inf", "fast"])
def test_demo_speed_must_be_a_positive_number(speed: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["demo", "--speed", speed])
    assert stop.value.code == 2
    assert "ridge demo: error: argument --speed:" in capsys.readouterr().err


def test_a_fleet_file_that_does_not_parse_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("pools: [\n  a: b\n")
    assert main(["serve", "--config", str(fleet)]) == 2
    assert _error_lines(capsys) == [
        f"ridge: {fleet}: not valid YAML at line 3, column 1: expected ',' or ']', but got "
        "'<stream end>' (while parsing a flow sequence)"]


@pytest.mark.parametrize("argv", [["serve", "--config"], ["demo", "--config"],
                                  ["render", "compose", "--out", "out"]])
def test_a_fleet_file_that_is_not_utf8_is_one_line(
        argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fleet.yaml").write_bytes(b"pools:\n  - name: caf\xe9\n")
    where = argv.index("--config") + 1 if "--config" in argv else 2
    argv = [*argv[:where], "fleet.yaml", *argv[where:]]
    assert main(argv) == 2
    [line] = _error_lines(capsys)
    assert line.endswith("fleet.yaml: not UTF-8 text (byte 0xe9 at offset 20); save it as UTF-8")


def test_demo_with_a_missing_fleet_file(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert _error_lines(capsys) == [f"ridge: {tmp_path / 'nope.yaml'}: cannot read: "
                                    "No such file or directory"]


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port something listens on, for the length of the test."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@pytest.mark.parametrize("command", ["serve", "demo"])
def test_a_port_in_use_is_one_line_naming_it(
        command: str, taken_port: int, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--config", str(DEMO_FLEET_FILE)] if command == "serve" else []
    assert main([command, *argv, "--host", "127.0.0.1", "--port", str(taken_port)]) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and captured.out == ""  # demo: nothing announced
    assert captured.err.strip().splitlines() == [
        f"ridge: cannot listen on 127.0.0.1:{taken_port}: the port is already in use; "
        "pass --port with a free port (or set RIDGE_PORT)"]


def test_demo_moves_off_a_default_port_in_use(taken_port: int,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    settings = Settings.model_construct(_fields_set=set(), port=taken_port)
    sock, admin, moved = cli.demo_listeners(settings)
    with sock:
        port = sock.getsockname()[1]
        assert admin is None and port != taken_port and moved.port == port
    assert (f"127.0.0.1:{taken_port} is in use; the gateway listens on port {port} instead"
            in capsys.readouterr().out)


def test_demo_keeps_to_a_port_the_user_chose(taken_port: int,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIDGE_PORT", str(taken_port))
    with pytest.raises(ListenError, match=f"127.0.0.1:{taken_port}: the port is already"):
        cli.demo_listeners(Settings())


def test_a_taken_admin_port_names_its_variable(taken_port: int) -> None:
    with pytest.raises(ListenError, match=f":{taken_port}: .* set RIDGE_ADMIN_PORT"):
        cli.admin_socket(Settings(admin_port=taken_port))

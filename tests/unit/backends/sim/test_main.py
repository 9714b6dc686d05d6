"""The command line: arguments and a bad fleet file."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.sim.__main__ import main, parse_args


def test_arguments() -> None:
    args = parse_args(["--config", "f.yaml", "--speed", "4", "--seed", "9"])
    assert (args.config, args.speed, args.seed) == ("f.yaml", 4.0, 9)
    with pytest.raises(SystemExit):
        parse_args(["--config", "f.yaml", "--speed", "0"])
    with pytest.raises(SystemExit):
        parse_args([])


def test_a_bad_fleet_file_exits_2_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "fleet.yaml"
    bad.write_text("pools: []\n")
    assert main(["--config", str(bad)]) == 2
    assert "pools" in capsys.readouterr().err

"""gateway.render.assets: the checkout's deployment files, or a clear refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.render.assets import default_root, find_assets
from gateway.render.blueprint import RenderError
from tests.unit.gateway.render.fleets import ROOT


def test_the_checkout_holds_every_file() -> None:
    assets = find_assets()
    assert default_root() == ROOT
    assert [p.name for p in assets.rule_files()] == ["ridge.alerts.yml", "ridge.rules.yml"]
    assert len(assets.dashboards()) == 4 and assets.dockerfile.is_file()
    assert all(p.is_file() for p in assets.provisioning().values())


def test_another_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RenderError, match="is not a ridge checkout"):
        find_assets(tmp_path)

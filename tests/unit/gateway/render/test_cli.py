"""``ridge render compose|k8s``: files written, next steps said, mistakes refused with status 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gateway.cli.main import main
from tests.unit.gateway.render.fleets import ROOT, rich_raw

EXAMPLE = str(ROOT / "deploy" / "fleet.example.yaml")


def test_compose(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "mine.txt").write_text("kept")
    assert main(["render", "compose", EXAMPLE, "-o", str(tmp_path), "--ridge-replicas", "3"]) == 0
    compose = yaml.safe_load((tmp_path / "compose.yaml").read_text())
    assert compose["services"]["ridge"]["deploy"]["replicas"] == 3
    assert compose["services"]["ridge"]["ports"] == ["8080-8082:8080"]
    assert (tmp_path / "mine.txt").read_text() == "kept"
    out = capsys.readouterr().out
    assert "docker compose --project-directory" in out and "up -d --build" in out
    assert f"next: put GRAFANA_ADMIN_PASSWORD in {tmp_path}/.env" in out


def test_k8s_with_secrets_namespace_and_images(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(yaml.safe_dump(rich_raw()))
    out = tmp_path / "k8s"
    assert main(["render", "k8s", str(fleet), "-o", str(out), "--namespace", "llm",
                 "--image", "ridge=registry.example/ridge:1"]) == 0
    ridge = list(yaml.safe_load_all((out / "30-ridge.yaml").read_text()))
    deployment = next(o for o in ridge if o["kind"] == "Deployment")
    assert deployment["metadata"]["namespace"] == "llm"
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == \
        "registry.example/ridge:1"
    captured = capsys.readouterr()
    assert "kubectl create secret generic ridge-engine-keys -n llm" in captured.out
    assert "--from-literal=SGL_KEY=..." in captured.out and "kubectl apply -k" in captured.out
    assert "kubectl create secret generic ridge-grafana -n llm " \
        "--from-literal=admin-password=..." in captured.out
    assert "warning: routing.features.tokenizers" in captured.err


@pytest.mark.parametrize(("argv", "message"), [
    (["--image", "nginx=x"], "expected SERVICE=IMAGE"),
    (["--ridge-replicas", "0"], "at least one replica"),
])
def test_bad_options(argv: list[str], message: str, tmp_path: Path,
                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "compose", EXAMPLE, "-o", str(tmp_path), *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_bad_fleet_or_checkout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "k8s", str(tmp_path / "missing.yaml"), "-o", str(tmp_path)]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["render", "k8s", EXAMPLE, "-o", str(tmp_path / "o"),
                 "--assets", str(tmp_path)]) == 2
    assert "is not a ridge checkout" in capsys.readouterr().err

"""The project files a rendered deployment reuses, found in a ridge checkout.

A deployment ships ridge's Prometheus configuration and rules (``deploy/prometheus/``) and its
Grafana provisioning and dashboards (``grafana/``) as they are in the repository — one copy of
each, never a second one inside the renderer — and builds the image from
``deploy/docker/Dockerfile``. Those files are not Python package data, so ``ridge render`` runs
from a checkout (the one the image is built from): by default the checkout this package was
imported from, else the one named by ``--assets``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gateway.render.blueprint import RenderError

PROMETHEUS_CONFIG = "deploy/prometheus/prometheus.yml"
PROMETHEUS_RULES = "deploy/prometheus/rules"
GRAFANA_PROVISIONING = "grafana/provisioning"
GRAFANA_DASHBOARDS = "grafana/dashboards"
DOCKERFILE = "deploy/docker/Dockerfile"


@dataclass(frozen=True, slots=True)
class Assets:
    """A ridge checkout's deployment files."""

    root: Path

    @property
    def prometheus_config(self) -> Path:
        return self.root / PROMETHEUS_CONFIG

    def rule_files(self) -> list[Path]:
        return sorted((self.root / PROMETHEUS_RULES).glob("*.yml"))

    def provisioning(self) -> dict[str, Path]:
        """Grafana provisioning files by kind (``datasources``, ``dashboards``)."""
        base = self.root / GRAFANA_PROVISIONING
        return {kind: base / kind / "ridge.yml" for kind in ("datasources", "dashboards")}

    def dashboards(self) -> list[Path]:
        return sorted((self.root / GRAFANA_DASHBOARDS).glob("*.json"))

    @property
    def dockerfile(self) -> Path:
        return self.root / DOCKERFILE


def default_root() -> Path:
    """The checkout this package lives in (``gateway/render/`` is two levels below it)."""
    return Path(__file__).resolve().parents[2]


def find_assets(root: Path | None = None) -> Assets:
    """The deployment files under ``root`` (default :func:`default_root`); RenderError if the
    directory is not a ridge checkout."""
    assets = Assets((root or default_root()).resolve())
    needed = [assets.prometheus_config, *assets.provisioning().values(), assets.dockerfile]
    missing = [str(p) for p in needed if not p.is_file()]
    if not assets.rule_files() or not assets.dashboards():
        missing.append(f"{assets.root / PROMETHEUS_RULES}/*.yml, "
                       f"{assets.root / GRAFANA_DASHBOARDS}/*.json")
    if missing:
        raise RenderError(f"{assets.root} is not a ridge checkout (missing: {', '.join(missing)}); "
                          "run ridge render from one, or pass --assets CHECKOUT")
    return assets

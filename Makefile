# ridge — the two commands a newcomer runs: `make demo` and `make test`.
# Both build their own virtual environment (.venv) on first use.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PORT   ?=
APT_PACKAGES ?= prometheus redis-server curl chromium fonts-dejavu-core

.PHONY: demo test test-fast lint typecheck engines deps native clean-native bench-overhead clean

$(STAMP): pyproject.toml bench/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]' -e ./bench
	touch $(STAMP)

deps: $(STAMP)
	@if [ -n "$(APT_PACKAGES)" ]; then bash deploy/apt-install.sh $(APT_PACKAGES); fi

## The request hot path's modules compiled to C with mypyc (and those written in C built),
## beside their sources (gateway/native.py), and again whenever one's source changes. Without
## a C compiler the sources run (make test requires it).
NATIVE := build/native/.built
NATIVE_SOURCES := $(shell $(PYTHON) -c "from gateway.native import NATIVE, WRITTEN_IN_C; print(*(m.replace('.', '/') + '.py' for m in NATIVE), *(m.replace('.', '/') + '.c' for m in WRITTEN_IN_C))")
$(NATIVE): $(STAMP) $(shell find routing -name "*.py") $(NATIVE_SOURCES) gateway/native.py deploy/compile_routing.py setup.py
	$(BIN)/python deploy/compile_routing.py $(NATIVE_FLAGS)
	@mkdir -p $(dir $@) && touch $@

native: $(NATIVE)

clean-native:
	$(BIN)/python deploy/compile_routing.py --clean
	rm -f $(NATIVE)

## The gateway in front of the simulated demo fleet, on http://127.0.0.1:8080 (a free port
## near it when 8080 is taken; `make demo PORT=9000` for that port and no other)
demo: $(NATIVE)
	$(BIN)/ridge demo $(if $(PORT),--port $(PORT))

## The real engine environment and model (cached in .engines/; seconds when cached)
engines:
	bash deploy/vllm-cpu/setup.sh

typecheck: $(STAMP)
	$(BIN)/mypy
	$(BIN)/mypy setup.py deploy/compile_routing.py

lint: $(STAMP)
	$(BIN)/ruff check gateway routing backends config bench/ridge_bench tests setup.py \
		deploy/compile_routing.py

## Everything: type checks, lint, unit, integration and real-engine tests (the compiled
## modules' units twice: compiled, then on their sources)
test: NATIVE_FLAGS := --require
test: deps engines native typecheck lint
	$(BIN)/pytest -q -p no:cacheprovider
	RIDGE_PURE_PYTHON=1 $(BIN)/pytest -q -p no:cacheprovider tests/unit/routing \
		tests/unit/gateway/request tests/unit/gateway/access tests/unit/gateway/server \
		tests/unit/gateway/telemetry tests/unit/backends/upstream

## Without the real engines
test-fast: deps native typecheck lint
	$(BIN)/pytest -q -p no:cacheprovider -m "not real_engine"

## The gateway overhead benchmark (docs/benchmarks/overhead.md; about 10 minutes)
bench-overhead: $(NATIVE)
	$(BIN)/python -m ridge_bench.overhead

clean:
	-$(BIN)/python deploy/compile_routing.py --clean
	rm -rf $(VENV) .bench-venv .mypy_cache .pytest_cache .ruff_cache build/native

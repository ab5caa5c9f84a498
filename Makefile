# skewtrace build and test entry points. `make test` is what CI runs (.ci/run calls it).
SHELL := /bin/bash
VENV ?= $(HOME)/.cache/skewtrace/venv
PY := $(VENV)/bin/python
BUILD := $(CURDIR)/build
OTELCOL := $(BUILD)/otelcol-skewtrace
JAEGER := $(BUILD)/jaeger
export SKEWTRACE_OTELCOL := $(OTELCOL)
export SKEWTRACE_JAEGER := $(JAEGER)
# pytest-xdist workers for the first part of `make test` (docs/testing.md: the two parts): two
# by default, what CI runs (about 25 minutes beside a CPU hog against 37 serially; both runs
# of 2026-12-06 beside the hog passed). TEST_WORKERS=0 runs it serially.
# A test file runs on one worker (--dist loadfile): a module's shared fixtures (a job run
# once, a collector kept up) are set up once, and tests that use fixed ports (the default
# ports in test_collector_auth.py) never run beside each other. Files are handed out longest
# first (tests/conftest.py orders them by the last run's durations), not by test count.
TEST_WORKERS ?= 2

.PHONY: all venv collector jaeger generate lint test test-fast test-go test-py demo bench eval clean

all: venv collector

# The venv lives at a stable path outside the checkout so CI reuses torch (several GB).
# The venv is shared by every checkout on the machine: point its editable install at this one.
venv: $(VENV)/.skewtrace-installed
	@$(PY) -c 'import skewtrace, sys; sys.exit(not skewtrace.__file__.startswith("$(CURDIR)/src/"))' \
	  || $(PY) -m pip install -q --no-deps -e .
$(VENV)/.skewtrace-installed: pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[torch,dev,frameworks,demo,timeline]'
	touch $@

collector: $(OTELCOL)
$(OTELCOL): $(shell find src/collector collector-config -type f \( -name '*.go' -o -name 'go.mod' -o -name 'go.sum' -o -name 'builder-config.yaml' \) 2>/dev/null)
	bash collector-config/build.sh $(OTELCOL)

jaeger: $(JAEGER)
$(JAEGER): tools/jaeger/go.mod
	bash tools/jaeger/build.sh $(JAEGER)

# Names: src/semconv/registry.yaml -> semconv.py, semconv.go, loadgen, docs tables.
generate: venv
	$(PY) tools/semconvgen/generate.py
	bash src/collector/generate.sh

lint: venv
	$(PY) tools/semconvgen/generate.py --check
	bash src/collector/generate.sh --check
	$(VENV)/bin/ruff check src tests examples benchmarks grafana tools/semconvgen
	$(VENV)/bin/ruff format --check src tests examples benchmarks grafana tools/semconvgen
	$(VENV)/bin/mypy
	cd src/collector && go vet ./...
	cd tools/loadgen && go vet ./...
	@test -z "$$(gofmt -l src/collector tools/loadgen)" || { gofmt -l src/collector tools/loadgen; exit 1; }

# -short leaves out the Go tests of a 4096-rank job's trace shape (a minute and more);
# tests/test_trace_shape.py plays such a job through the binary, and `make eval` runs them.
test-go:
	cd src/collector && go test -short -count=1 ./...
	cd tools/loadgen && go test -count=1 ./...

# Two parts: everything but the tests marked alone, on TEST_WORKERS workers; then those, with
# the machine to themselves (they read host-wide series that other tests' jobs move). Both
# parts run; the target fails when either did.
test-py: venv collector jaeger
	@status=0; \
	$(PY) -m pytest -q --durations=25 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
		-m "not alone" || status=$$?; \
	$(PY) -m pytest -q --durations=10 -m alone || status=$$?; \
	exit $$status

test: lint test-go test-py

# The inner loop: the Go tests (through Go's test cache: packages unchanged since their last
# pass are not run again) and the Python tests not marked slow (no lint, and none of the
# multi-process, real-Collector pipeline, Prometheus or Jaeger runs, nor unit tests of a second
# or more). `make test` runs them all, uncached.
test-fast: venv collector
	cd src/collector && go test ./...
	cd tools/loadgen && go test ./...
	$(PY) -m pytest -q -m "not slow" -n 2 --dist loadfile --no-loadscope-reorder

demo: venv collector
	$(PY) -m skewtrace.cli demo

# Every benchmark the docs cite, at the parameters they cite (several hours; the fabric ones,
# scenarios.py, collision.py and no_harm.py, need root), then the Go benchmarks. Each runs
# whatever the ones before it did (several exit 1 on a missed target); the target fails if
# any did. tests/test_benchmark_smoke.py runs each at its smallest (--smoke).
bench: venv collector
	@status=0; \
	run() { echo "== python $$*"; $(PY) "$$@" || { echo "== exit $$? from python $$*"; status=1; }; }; \
	run benchmarks/overhead.py; \
	run benchmarks/collector_e2e.py; \
	run benchmarks/trace_shape.py --ranks 1024 4096 --steps 4; \
	run benchmarks/scale.py --ranks 1024,4096 --rounds 2 --step-rate 1024:1,4096:0.25; \
	run benchmarks/scale.py --ranks 1024,4096 --skip-throughput --step-rate 1024:1,4096:0.15; \
	run benchmarks/node_telemetry_overhead.py --passes 200 --rounds 5; \
	run benchmarks/soak.py --seconds 180 --memory-limit-mib 512; \
	run benchmarks/pacing.py --runs 3 --steps 300 --warmup 60; \
	run benchmarks/rebalance.py --steps 600; \
	run benchmarks/diagnosis_table.py --seeds 3; \
	run benchmarks/whatif_corpus.py --large; \
	run benchmarks/remedies.py; \
	run benchmarks/sim_pacing.py --seed 1; \
	run benchmarks/sim_pacing.py --seed 2; \
	for seed in 1 2 3; do run benchmarks/sim_pacing.py --interleave-offline --seed $$seed; done; \
	run benchmarks/scenarios.py --repeat 2 --pacing; \
	run benchmarks/collision.py; \
	run benchmarks/collision.py --controlled --arm interleave --interleave-effect-pairs 3 \
		--controlled-steps 1800 --controlled-warmup 600; \
	run benchmarks/collision.py --layout sets --arm interleave --interleave-effect-pairs 3 \
		--controlled-steps 600 --controlled-warmup 100 --sample-time 0.003 --set-offset 0.08; \
	run benchmarks/no_harm.py; \
	(cd src/collector && go test -run '^$$' -bench . -benchmem ./...) || status=1; \
	exit $$status

# The live per-scenario evaluation, not part of `make test` (hours on two cores): the tests
# marked eval (every fabric scenario, the whole framework matrix, the demo's defaults), one
# after another with the machine to themselves, then the benchmarks whose tables
# docs/evaluation.md holds, each table written back between its markers.
eval: venv collector jaeger
	@status=0; \
	$(PY) -m pytest -q --durations=25 -m eval || status=$$?; \
	(cd src/collector && go test -count=1 -run 'At4096Ranks' ./...) || status=$$?; \
	$(PY) tools/eval_tables.py --doc docs/evaluation.md || status=$$?; \
	exit $$status

clean:
	rm -rf $(BUILD)

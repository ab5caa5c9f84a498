#!/usr/bin/env bash
# Zero-code tracing: examples/train_plain.py (DDP, no skewtrace import) under
# opentelemetry-instrument, which loads skewtrace through its `opentelemetry_instrumentor`
# entry point. torchrun starts every worker as `opentelemetry-instrument python
# train_plain.py` (--no-python), so the workers are traced and the launcher is not.
#
#   bash examples/zero_code.sh [--steps N]
#
# Needs skewtrace and torch installed (the venv active, or PYTHON=/path/to/python) and an
# otelcol-skewtrace listening at OTEL_EXPORTER_OTLP_ENDPOINT. Environment:
#   NPROC                         ranks on this machine (default 2)
#   SKEWTRACE_JOB_ID              the job id every rank reports (default zero-code-<time>-<pid>)
#   OTEL_EXPORTER_OTLP_ENDPOINT   where spans go (default http://127.0.0.1:4317)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-python3}
NPROC=${NPROC:-2}
export SKEWTRACE_JOB_ID=${SKEWTRACE_JOB_ID:-zero-code-$(date +%s)-$$}
export OTEL_EXPORTER_OTLP_ENDPOINT=${OTEL_EXPORTER_OTLP_ENDPOINT:-http://127.0.0.1:4317}

exec "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node="$NPROC" --no-python \
  opentelemetry-instrument "$PYTHON" "$here/train_plain.py" "$@"

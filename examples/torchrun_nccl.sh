#!/usr/bin/env bash
# examples/train_ddp.py on every GPU of this node, NCCL, under torchrun, traced by skewtrace.
#
#   bash examples/torchrun_nccl.sh [train_ddp.py arguments, e.g. --steps 200 --straggler 3:compute:0.02]
#
# Environment:
#   NPROC                         GPUs to use (default: every GPU nvidia-smi lists)
#   SKEWTRACE_JOB_ID              the job id every rank reports (default nccl-<host>-<time>)
#   OTEL_EXPORTER_OTLP_ENDPOINT   the otelcol-skewtrace to send to (default http://127.0.0.1:4317)
#   SKEWTRACE_PACER_URL           optional: a `skewtrace pacer` to take delays from
# For several nodes, run it under Slurm instead (examples/slurm/train.sbatch).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NPROC=${NPROC:-$(nvidia-smi -L | grep -c '^GPU')}
export SKEWTRACE_JOB_ID=${SKEWTRACE_JOB_ID:-nccl-$(hostname -s)-$(date +%s)}
export OTEL_EXPORTER_OTLP_ENDPOINT=${OTEL_EXPORTER_OTLP_ENDPOINT:-http://127.0.0.1:4317}
# Per-collective GPU start/end times from NCCL's completion hook where torch offers it to
# Python (the classic ProcessGroupNCCL; docs/configuration.md, "GPU"). Harmless otherwise.
export TORCH_NCCL_ENABLE_TIMING=1

exec torchrun --standalone --nproc-per-node="$NPROC" "$here/train_ddp.py" --backend nccl "$@"

#!/usr/bin/env bash
# Builds Jaeger v2 (cmd/jaeger from github.com/jaegertracing/jaeger v1.76.0) to the path given
# as the only argument. The module here pins the version; the Go module and build caches are
# the user's defaults, so a second build only relinks.
#
#   bash tools/jaeger/build.sh build/jaeger
#
# Built from the module, the binary carries no UI assets; its OTLP receivers and HTTP query
# API (/api/traces, /api/v3/traces) are complete, which is what the tests use.
set -euo pipefail
if [[ $# -ne 1 ]]; then
  echo "usage: $0 OUTPUT_PATH" >&2
  exit 2
fi
out="$1"
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac
mkdir -p "$(dirname "$out")"
cd "$(dirname "$0")"
CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$out" github.com/jaegertracing/jaeger/cmd/jaeger
echo "built $out"

#!/usr/bin/env bash
# Builds the otelcol-skewtrace distribution from collector-config/builder-config.yaml.
#
#   bash collector-config/build.sh [OUT]      (default: build/otelcol-skewtrace)
#
# On a clean machine it installs the OpenTelemetry Collector Builder (OCB) at the pinned
# version, generates the distribution's sources into build/otelcol-src and compiles them.
# It reuses Go's module cache and build cache, regenerates only when the manifest or the
# barrierskew module's go.mod changed, and `go build` relinks only when a source changed, so
# a second run with nothing changed takes seconds.
set -euo pipefail

BUILDER_VERSION=v0.165.0
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-$repo/build/otelcol-skewtrace}
case $out in /*) ;; *) out=$PWD/$out ;; esac
manifest=$repo/collector-config/builder-config.yaml
src=$repo/build/otelcol-src
stamp=$src/.skewtrace-manifest.sha256

command -v go >/dev/null || { echo "build.sh: Go is not installed (need Go >= 1.26)" >&2; exit 1; }

builder=$(go env GOPATH)/bin/builder
if ! "$builder" version 2>/dev/null | grep -q "$BUILDER_VERSION"; then
  echo "build.sh: installing builder $BUILDER_VERSION" >&2
  go install "go.opentelemetry.io/collector/cmd/builder@$BUILDER_VERSION"
fi

# What the generated sources and go.mod depend on.
want=$(cat "$manifest" "$repo/src/collector/go.mod" | sha256sum | cut -d' ' -f1)
have=$(cat "$stamp" 2>/dev/null || true)
if [[ ! -f $src/go.mod || ! -f $src/components.go || $want != "$have" ]]; then
  echo "build.sh: generating sources in ${src#"$repo"/}" >&2
  mkdir -p "$src"
  # `-e` lets the builder's `go mod tidy` pass over test-only imports of contrib modules that
  # the module proxy does not serve (fileexporter's tests import otlpencodingextension
  # v0.165.1); the build below still fails loudly if any module the binary needs is missing.
  (cd "$repo" && GOFLAGS="$(go env GOFLAGS) -e" "$builder" \
    --config "$manifest" --skip-compilation)
  echo "$want" >"$stamp"
fi

mkdir -p "$(dirname "$out")"
echo "build.sh: compiling ${out#"$repo"/}" >&2
(cd "$src" && go build -trimpath -ldflags="-s -w" -o "$out" .)
"$out" --version

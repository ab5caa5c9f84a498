"""The distribution's manifest and configs: consistent versions, documented variables, and
configs that the built otelcol-skewtrace accepts (and a bad one it rejects by key name)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from collector_harness import (
    CONFIG_DIR,
    FILE_EXPORT_YAML,
    GATEWAY_YAML,
    OTELCOL_YAML,
    PASSTHROUGH_YAML,
    REPO_ROOT,
)

MANIFEST = CONFIG_DIR / "builder-config.yaml"
PPROF_YAML = CONFIG_DIR / "pprof.yaml"
CORE_PREFIX = "go.opentelemetry.io/collector/"
CONTRIB_PREFIX = "github.com/open-telemetry/opentelemetry-collector-contrib/"
OUR_MODULE = "github.com/skewtrace/skewtrace/src/collector"
# Modules of the core repository that are stable (v1.x); every other core module is v0.x.
CORE_STABLE_VERSION = "v1.71.0"
CORE_BETA_VERSION = "v0.165.0"
CONTRIB_VERSION = "v0.165.1"
# The proxy these machines use serves no loadbalancingexporter newer than this (see the
# manifest's header); anything else off-release is a mistake.
CONTRIB_EXCEPTIONS = {CONTRIB_PREFIX + "exporter/loadbalancingexporter": "v0.161.0"}

REQUIRED = {
    "receivers": ["go.opentelemetry.io/collector/receiver/otlpreceiver"],
    "processors": [
        "go.opentelemetry.io/collector/processor/memorylimiterprocessor",
        "go.opentelemetry.io/collector/processor/batchprocessor",
        OUR_MODULE + "/processor/barrierskewprocessor",
    ],
    "connectors": [OUR_MODULE + "/connector/barrierskewconnector"],
    "exporters": [
        "go.opentelemetry.io/collector/exporter/otlpexporter",
        "go.opentelemetry.io/collector/exporter/otlphttpexporter",
        "go.opentelemetry.io/collector/exporter/debugexporter",
        CONTRIB_PREFIX + "exporter/prometheusexporter",
        CONTRIB_PREFIX + "exporter/fileexporter",
        CONTRIB_PREFIX + "exporter/loadbalancingexporter",
    ],
    "extensions": [CONTRIB_PREFIX + "extension/healthcheckextension"],
}


def _manifest() -> dict:
    return yaml.safe_load(MANIFEST.read_text())


def _modules(manifest: dict) -> list[tuple[str, str, str]]:
    """(section, import path, version) of every component and provider."""
    out = []
    for section in (
        "receivers",
        "processors",
        "connectors",
        "exporters",
        "extensions",
        "providers",
    ):
        for entry in manifest.get(section, []):
            module, version = entry["gomod"].split()
            out.append((section, entry.get("import", module), version))
    telemetry = manifest["telemetry"]
    module, version = telemetry["gomod"].split()
    out.append(("telemetry", module, version))
    return out


def test_manifest_carries_every_required_component() -> None:
    manifest = _manifest()
    have = {(section, path) for section, path, _ in _modules(manifest)}
    missing = [(s, p) for s, paths in REQUIRED.items() for p in paths if (s, p) not in have]
    assert not missing, f"builder-config.yaml lacks {missing}"
    assert manifest["dist"]["name"] == "otelcol-skewtrace"


def test_manifest_modules_are_one_release() -> None:
    wrong = []
    for _, path, version in _modules(_manifest()):
        if path.startswith(OUR_MODULE):
            continue
        if path.startswith(CORE_PREFIX):
            expected = {CORE_BETA_VERSION, CORE_STABLE_VERSION}
        elif path.startswith(CONTRIB_PREFIX):
            expected = {CONTRIB_EXCEPTIONS.get(path, CONTRIB_VERSION)}
        else:
            expected = set()
        if version not in expected:
            wrong.append((path, version, sorted(expected)))
    assert not wrong, f"modules off the release: {wrong}"


def test_manifest_builds_barrierskew_from_this_checkout() -> None:
    manifest = _manifest()
    output = REPO_ROOT / manifest["dist"]["output_path"]
    replaces = dict(r.split(" => ") for r in manifest["replaces"])
    local = (output / replaces[OUR_MODULE]).resolve()
    assert local == (REPO_ROOT / "src" / "collector").resolve()
    go_mod = (local / "go.mod").read_text()
    assert re.search(rf"^module {re.escape(OUR_MODULE)}$", go_mod, re.M)


ENV_REF = re.compile(r"\$\{env:([A-Z0-9_]+)(?::-([^}]*))?\}")


@pytest.mark.parametrize(
    "config", [OTELCOL_YAML, FILE_EXPORT_YAML, GATEWAY_YAML, PPROF_YAML], ids=lambda p: p.name
)
def test_every_env_var_is_listed_in_the_header(config: Path) -> None:
    text = config.read_text()
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    used = {m.group(1): m.group(2) for m in ENV_REF.finditer(text)}
    assert used, f"{config.name} reads no environment variable"
    for name, default in used.items():
        listed = re.search(rf"^#\s+{name}\s+(\S+)", header, re.M)
        assert listed, f"{config.name}: {name} is used but not listed in the header"
        assert default is not None, f"{config.name}: {name} has no default"
        assert listed.group(1) == default, (
            f"{config.name}: header says {name} defaults to {listed.group(1)}, "
            f"the config to {default}"
        )


def test_dockerfile_refers_to_files_that_exist() -> None:
    """No Docker engine here, so the image cannot be built; its inputs can be checked."""
    dockerfile = (CONFIG_DIR / "Dockerfile").read_text()
    sources = []
    for line in dockerfile.splitlines():
        parts = line.split()
        if parts[:1] == ["COPY"] and not any(p.startswith("--from") for p in parts):
            sources += parts[1:-1]
    assert sources, "Dockerfile copies nothing from the build context"
    for src in sources:
        assert (REPO_ROOT / src).exists(), f"Dockerfile copies {src}, which does not exist"
    assert "collector-config/build.sh" in dockerfile
    default_config = re.search(r'CMD \["--config", "(/etc/otelcol-skewtrace/[^"]+)"\]', dockerfile)
    assert default_config and default_config.group(1).endswith("/otelcol.yaml")


# -- with the built binary -------------------------------------------------------------------


def _run(
    binary: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(binary), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.collector
@pytest.mark.parametrize(
    "configs",
    [
        [OTELCOL_YAML],
        [OTELCOL_YAML, FILE_EXPORT_YAML],
        [OTELCOL_YAML, PPROF_YAML],
        [GATEWAY_YAML],
        [PASSTHROUGH_YAML],
    ],
    ids=["otelcol", "otelcol+file-export", "otelcol+pprof", "gateway", "passthrough"],
)
def test_binary_accepts_config(otelcol_path: Path, configs: list[Path]) -> None:
    args = ["validate"]
    for config in configs:
        args += ["--config", str(config)]
    result = _run(otelcol_path, *args)
    assert result.returncode == 0, result.stderr


@pytest.mark.collector
def test_binary_carries_the_components(otelcol_path: Path) -> None:
    listing = yaml.safe_load(_run(otelcol_path, "components").stdout)
    names = {
        kind: {c["name"] for c in listing.get(kind) or []}
        for kind in ("receivers", "processors", "connectors", "exporters", "extensions")
    }
    assert {"otlp"} <= names["receivers"]
    assert {"memory_limiter", "batch", "barrierskew"} <= names["processors"]
    assert {"barrierskew"} <= names["connectors"]
    assert {"otlp_grpc", "otlp_http", "debug", "file", "prometheus", "load_balancing"} <= names[
        "exporters"
    ]
    assert {"health_check"} <= names["extensions"]


@pytest.mark.collector
def test_bad_barrierskew_setting_is_rejected_by_key(otelcol_path: Path) -> None:
    result = _run(
        otelcol_path,
        "validate",
        "--config",
        str(OTELCOL_YAML),
        env={"SKEWTRACE_WAIT_TIMEOUT": "-1s"},
    )
    assert result.returncode != 0
    assert "wait_timeout" in result.stderr, result.stderr

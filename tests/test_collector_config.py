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
    GATEWAY_BY_JOB_YAML,
    GATEWAY_YAML,
    OTELCOL_YAML,
    PASSTHROUGH_YAML,
    REPO_ROOT,
)

MANIFEST = CONFIG_DIR / "builder-config.yaml"
PPROF_YAML = CONFIG_DIR / "pprof.yaml"
NETWORK_AUTH_YAML = CONFIG_DIR / "network-auth.yaml"
GATEWAY_AUTH_YAML = CONFIG_DIR / "gateway-auth.yaml"
METRICS_AUTH_YAML = CONFIG_DIR / "metrics-auth.yaml"
INTERNAL_OTLP_YAML = CONFIG_DIR / "internal-otlp.yaml"
GATEWAY_TIER2_YAML = CONFIG_DIR / "gateway-tier2.yaml"
GATEWAY_TIER2_AUTH_YAML = CONFIG_DIR / "gateway-tier2-auth.yaml"
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
        OUR_MODULE + "/processor/barrierskewverdictprocessor",
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
    "extensions": [
        CONTRIB_PREFIX + "extension/healthcheckextension",
        CONTRIB_PREFIX + "extension/bearertokenauthextension",
    ],
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
# How a header writes a default that is not a word: empty, or none (the collector refuses to
# start without the variable: tokens, certificates).
HEADER_DEFAULTS = {"(empty)": "", "(required)": None}
OVERLAYS = [
    FILE_EXPORT_YAML,
    PPROF_YAML,
    NETWORK_AUTH_YAML,
    GATEWAY_AUTH_YAML,
    METRICS_AUTH_YAML,
    INTERNAL_OTLP_YAML,
    GATEWAY_TIER2_YAML,
    GATEWAY_TIER2_AUTH_YAML,
]


@pytest.mark.parametrize("config", [OTELCOL_YAML, GATEWAY_YAML, *OVERLAYS], ids=lambda p: p.name)
def test_every_env_var_is_listed_in_the_header(config: Path) -> None:
    text = config.read_text()
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    used = {m.group(1): m.group(2) for m in ENV_REF.finditer(text)}
    assert used, f"{config.name} reads no environment variable"
    for name, default in used.items():
        listed = re.search(rf"^#\s+{name}\s+(\S+)", header, re.M)
        assert listed, f"{config.name}: {name} is used but not listed in the header"
        listed_default = HEADER_DEFAULTS.get(listed.group(1), listed.group(1))
        assert listed_default == default, (
            f"{config.name}: header says {name} defaults to {listed.group(1)}, "
            f"the config to {default}"
        )


def _default_listen_addresses(config: dict) -> dict[str, str]:
    """Every address a config listens on, with each ${env:VAR:-default} at its default."""
    found: dict[str, str] = {}

    def visit(node: object, path: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                visit(value, f"{path}::{key}" if path else str(key))
        elif isinstance(node, list):
            for index, value in enumerate(node):
                visit(value, f"{path}::{index}")
        elif isinstance(node, str) and path.endswith(("::endpoint", "::host")):
            found[path] = ENV_REF.sub(lambda m: m.group(2) or "", node)

    # Exporters' endpoints are where the collector connects to, not where it listens; the
    # Prometheus exporter is the one that serves.
    visit(config.get("receivers", {}), "receivers")
    visit(config.get("extensions", {}), "extensions")
    visit(config.get("exporters", {}).get("prometheus", {}), "exporters::prometheus")
    visit(config.get("service", {}).get("telemetry", {}), "service::telemetry")
    return found


@pytest.mark.parametrize(
    "config",
    [OTELCOL_YAML, GATEWAY_YAML, PASSTHROUGH_YAML, PPROF_YAML, GATEWAY_TIER2_YAML],
    ids=lambda p: p.name,
)
def test_default_listeners_are_loopback(config: Path) -> None:
    """Nothing authenticates in these configs, so by default nothing is reachable from
    another host (as with the upstream Collector); network-auth.yaml opens the OTLP ports."""
    addresses = _default_listen_addresses(yaml.safe_load(config.read_text()))
    assert addresses, f"{config.name} listens nowhere?"
    hosts = {path: value.rsplit(":", 1)[0] for path, value in addresses.items()}
    wrong = {path: host for path, host in hosts.items() if host not in ("127.0.0.1", "localhost")}
    assert not wrong, f"{config.name} listens beyond loopback by default: {wrong}"


def test_network_overlays_authenticate_every_listener_they_open() -> None:
    """An overlay that moves a listener off loopback puts TLS and the token on it."""
    for overlay in (NETWORK_AUTH_YAML, METRICS_AUTH_YAML, GATEWAY_TIER2_AUTH_YAML):
        config = yaml.safe_load(overlay.read_text())
        receivers = config.get("receivers", {})
        protocols = (receivers.get("otlp") or receivers.get("otlp/verdicts") or {}).get(
            "protocols", {}
        )
        prometheus = config.get("exporters", {}).get("prometheus")
        servers = [*protocols.values(), *([prometheus] if prometheus else [])]
        assert servers, overlay.name
        for server in servers:
            assert server["auth"]["authenticator"] == "bearertokenauth/otlp", overlay.name
            assert {"cert_file", "key_file"} <= set(server["tls"]), overlay.name
    tier1 = yaml.safe_load(GATEWAY_AUTH_YAML.read_text())
    for name, exporter in tier1["exporters"].items():
        otlp = exporter["protocol"]["otlp"]
        assert otlp["tls"]["insecure"] is False, name
        assert otlp["auth"]["authenticator"] == "bearertokenauth/tier2", name
    # Every tier-2 exporter that gateway-tier2.yaml adds sends over TLS with a token.
    added = yaml.safe_load(GATEWAY_TIER2_YAML.read_text())["exporters"]
    secured = yaml.safe_load(GATEWAY_TIER2_AUTH_YAML.read_text())["exporters"]
    assert set(added) == set(secured)
    for name, exporter in secured.items():
        otlp = exporter["protocol"]["otlp"]
        assert otlp["tls"]["insecure"] is False, name
        assert otlp["auth"]["authenticator"] == "bearertokenauth/verdicts", name


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
        [GATEWAY_YAML, GATEWAY_BY_JOB_YAML],
        [PASSTHROUGH_YAML],
        [OTELCOL_YAML, FILE_EXPORT_YAML, NETWORK_AUTH_YAML, METRICS_AUTH_YAML],
        [GATEWAY_YAML, NETWORK_AUTH_YAML, GATEWAY_AUTH_YAML],
        # grafana/docker-compose.network.yaml's collector
        [OTELCOL_YAML, NETWORK_AUTH_YAML, INTERNAL_OTLP_YAML],
        [OTELCOL_YAML, FILE_EXPORT_YAML, GATEWAY_TIER2_YAML],
        [OTELCOL_YAML, NETWORK_AUTH_YAML, GATEWAY_TIER2_YAML, GATEWAY_TIER2_AUTH_YAML],
    ],
    ids=[
        "otelcol", "otelcol+file-export", "otelcol+pprof", "gateway", "gateway+by-job",
        "passthrough",
        "otelcol+network-auth+metrics-auth", "gateway+network-auth+gateway-auth",
        "otelcol+network-auth+internal-otlp", "tier2+file-export", "tier2+network-auth",
    ],
)  # fmt: skip
def test_binary_accepts_config(otelcol_path: Path, configs: list[Path]) -> None:
    args = ["validate"]
    for config in configs:
        args += ["--config", str(config)]
    # What the auth overlays cannot start without (validate does not read the files).
    env = {
        "SKEWTRACE_OTLP_TOKEN": "token",
        "SKEWTRACE_TLS_CERT_FILE": "/etc/skewtrace/tls/server.crt",
        "SKEWTRACE_TLS_KEY_FILE": "/etc/skewtrace/tls/server.key",
        "SKEWTRACE_TIER2_TOKEN": "tier2-token",
        "SKEWTRACE_VERDICT_TOKEN": "verdict-token",
    }
    result = _run(otelcol_path, *args, env=env)
    assert result.returncode == 0, result.stderr


@pytest.mark.collector
def test_network_auth_refuses_to_start_without_token_or_certificate(otelcol_path: Path) -> None:
    """Forgetting a variable must not leave the network listeners open."""
    blank = {
        name: ""
        for name in (
            "SKEWTRACE_OTLP_TOKEN", "SKEWTRACE_OTLP_TOKEN_FILE", "SKEWTRACE_TLS_CERT_FILE",
            "SKEWTRACE_TLS_KEY_FILE", "SKEWTRACE_TIER2_TOKEN", "SKEWTRACE_TIER2_TOKEN_FILE",
        )
    }  # fmt: skip
    result = _run(
        otelcol_path,
        "validate",
        *("--config", str(GATEWAY_YAML)),
        *("--config", str(NETWORK_AUTH_YAML)),
        *("--config", str(GATEWAY_AUTH_YAML)),
        env=blank,
    )
    assert result.returncode != 0
    for expected in (
        "extensions::bearertokenauth/otlp: no bearer token provided",
        "extensions::bearertokenauth/tier2: no bearer token provided",
        "receivers::otlp::protocols::grpc: tls: TLS configuration must include both",
    ):
        assert expected in result.stderr, result.stderr


@pytest.mark.collector
def test_binary_carries_the_components(otelcol_path: Path) -> None:
    listing = yaml.safe_load(_run(otelcol_path, "components").stdout)
    names = {
        kind: {c["name"] for c in listing.get(kind) or []}
        for kind in ("receivers", "processors", "connectors", "exporters", "extensions")
    }
    assert {"otlp"} <= names["receivers"]
    assert {"memory_limiter", "batch", "barrierskew", "barrierskewverdict", "traceshape"} <= names[
        "processors"
    ]
    assert {"barrierskew"} <= names["connectors"]
    assert {"otlp_grpc", "otlp_http", "debug", "file", "prometheus", "load_balancing"} <= names[
        "exporters"
    ]
    assert {"health_check", "bearertokenauth"} <= names["extensions"]


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

"""Checks ``grafana/docker-compose.yaml`` against what ``docs/viewing.md`` promises.

No Docker engine runs here, so the file is read the way Compose reads it (YAML plus Compose's
``${VAR:-default}`` interpolation) and checked for: the five services, build files and bind
mounts that exist, the published ports of the docs' table and nothing else, every port bound
to 127.0.0.1 unless SKEWTRACE_BIND_ADDRESS says otherwise, and settings that must agree across
files (the Collector's env vars exist in its config, the pacer's are flags it knows, Prometheus
and Tempo are configured the way the dashboard needs).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
GRAFANA_DIR = REPO_ROOT / "grafana"
COMPOSE_PATH = GRAFANA_DIR / "docker-compose.yaml"
VIEWING_DOC = REPO_ROOT / "docs" / "viewing.md"

SERVICES = {"otelcol-skewtrace", "tempo", "prometheus", "grafana", "pacer"}

_INTERPOLATION = re.compile(r"\$(?:\$|\{(\w+)(?:(:?[-?])([^}]*))?\}|(\w+))")


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Compose's variable interpolation: ${VAR}, ${VAR:-default}, ${VAR-default}, $VAR, $$."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1) or match.group(4)
        operator, default = match.group(2), match.group(3) or ""
        value = env.get(name)
        if operator == ":-" and not value:
            return default
        if operator == "-" and value is None:
            return default
        if operator in (":?", "?") and not value:
            raise ValueError(f"required variable {name} is not set: {default}")
        return value or ""

    return _INTERPOLATION.sub(replace, text)


def load_compose(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    return dict(yaml.safe_load(interpolate(COMPOSE_PATH.read_text(), env or {})))


def published_ports(compose: Mapping[str, Any]) -> list[tuple[str, str, int, int]]:
    """(service, host ip, host port, container port) of every short-syntax port mapping."""
    ports = []
    for name, service in compose["services"].items():
        for entry in service.get("ports", []):
            parts = str(entry).split(":")
            if len(parts) != 3:
                # HOST:CONTAINER or CONTAINER alone binds every interface.
                ports.append((name, "0.0.0.0", int(parts[-2] if len(parts) > 1 else parts[0]),
                              int(parts[-1])))  # fmt: skip
                continue
            ports.append((name, parts[0], int(parts[1]), int(parts[2].split("/")[0])))
    return ports


def documented_ports() -> dict[int, str]:
    """host port -> service from the ports table in docs/viewing.md."""
    ports = {}
    for line in VIEWING_DOC.read_text().splitlines():
        cells = [cell.strip().strip("`") for cell in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].isdigit():
            ports[int(cells[0])] = cells[1]
    return ports


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose()


def test_interpolation_follows_compose() -> None:
    env = {"SET": "x", "EMPTY": ""}
    assert (
        interpolate("${SET:-d} ${UNSET:-d} ${EMPTY:-d} ${EMPTY-d} $SET $$x", env) == "x d d  x $x"
    )
    with pytest.raises(ValueError, match="NEEDED"):
        interpolate("${NEEDED:?set it}", env)


def test_services(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) >= SERVICES


def test_builds_and_mounts_exist(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        build = service.get("build")
        if build:
            context = (GRAFANA_DIR / build["context"]).resolve()
            assert (context / build["dockerfile"]).is_file(), f"{name}: {build}"
        for volume in service.get("volumes", []):
            source = str(volume).split(":")[0]
            if source.startswith((".", "/")):
                assert (GRAFANA_DIR / source).exists(), f"{name}: mount source {source} missing"
            else:
                assert source in compose.get("volumes", {}), f"{name}: undeclared volume {source}"


def test_ports_are_the_documented_ones(compose: dict[str, Any]) -> None:
    documented = documented_ports()
    assert documented, "docs/viewing.md has no ports table"
    published = {host_port: service for service, _, host_port, _ in published_ports(compose)}
    assert published == documented


def test_ports_bind_to_localhost_by_default(compose: dict[str, Any]) -> None:
    ports = published_ports(compose)
    assert ports
    assert {ip for _, ip, _, _ in ports} == {"127.0.0.1"}


def test_bind_address_and_ports_can_be_changed_by_env() -> None:
    compose = load_compose({"SKEWTRACE_BIND_ADDRESS": "0.0.0.0", "SKEWTRACE_GRAFANA_PORT": "3001"})
    ports = published_ports(compose)
    assert {ip for _, ip, _, _ in ports} == {"0.0.0.0"}
    assert ("grafana", "0.0.0.0", 3001, 3000) in ports


def test_collector_env_vars_exist_in_its_config(compose: dict[str, Any]) -> None:
    """Each variable compose sets for the Collector is read by collector-config/otelcol.yaml,
    so renaming one there cannot silently leave the stack on defaults."""
    service = compose["services"]["otelcol-skewtrace"]
    mounted = {v.split(":")[1]: GRAFANA_DIR / v.split(":")[0] for v in service["volumes"]}
    configs = [mounted[arg.split("=", 1)[1]] for arg in service["command"]]
    assert REPO_ROOT / "collector-config" / "otelcol.yaml" in [c.resolve() for c in configs]
    used = {name for c in configs for name in re.findall(r"\$\{env:(\w+)", c.read_text())}
    assert sorted(set(service["environment"]) - used) == []


def test_traces_go_to_tempo_by_default(compose: dict[str, Any]) -> None:
    environment = compose["services"]["otelcol-skewtrace"]["environment"]
    assert environment["SKEWTRACE_TRACES_BACKEND_ENDPOINT"] == "tempo:4317"
    tempo = yaml.safe_load((GRAFANA_DIR / "tempo.yaml").read_text())
    assert tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].endswith(
        ":4317"
    )
    other = load_compose({"SKEWTRACE_TRACES_BACKEND_ENDPOINT": "jaeger.example:4317"})
    assert (
        other["services"]["otelcol-skewtrace"]["environment"]["SKEWTRACE_TRACES_BACKEND_ENDPOINT"]
        == "jaeger.example:4317"
    )


def test_collector_routes_otlp_metrics_to_prometheus() -> None:
    """The pacer pushes its own metrics (skewtrace.pacing.*) to the Collector over OTLP; the
    dashboard's pacing panels need a metrics pipeline from the otlp receiver to Prometheus."""
    config = yaml.safe_load((REPO_ROOT / "collector-config" / "otelcol.yaml").read_text())
    pipelines = config["service"]["pipelines"]
    assert any(
        name.split("/")[0] == "metrics"
        and "otlp" in pipeline["receivers"]
        and "prometheus" in pipeline["exporters"]
        for name, pipeline in pipelines.items()
    ), pipelines


def test_pacer_env_vars_are_flags_it_knows(compose: dict[str, Any]) -> None:
    from skewtrace.cli import _PACER_OPTIONS

    known = {option.env for option in _PACER_OPTIONS}
    environment = compose["services"]["pacer"]["environment"]
    assert sorted(set(environment) - known) == []
    assert environment["SKEWTRACE_PACER_METRICS_ENDPOINT"].startswith("otelcol-skewtrace:")


def test_prometheus_keeps_exemplars_and_scrapes_the_collector(compose: dict[str, Any]) -> None:
    service = compose["services"]["prometheus"]
    assert "--enable-feature=exemplar-storage" in service["command"]
    (config_mount,) = [v for v in service["volumes"] if v.startswith("./prometheus.yml")]
    config = yaml.safe_load((GRAFANA_DIR / config_mount.split(":")[0]).read_text())
    targets = {
        target
        for job in config["scrape_configs"]
        for static in job.get("static_configs", [])
        for target in static["targets"]
    }
    collector_endpoint = compose["services"]["otelcol-skewtrace"]["environment"][
        "SKEWTRACE_PROMETHEUS_ENDPOINT"
    ]
    assert f"otelcol-skewtrace:{collector_endpoint.rsplit(':', 1)[1]}" in targets
    assert "otelcol-skewtrace:8888" in targets


def test_prometheus_config_passes_promtool() -> None:
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    if not os.path.isfile(promtool):
        if os.environ.get("CI"):
            pytest.fail("promtool missing (apt-get install prometheus)")
        pytest.skip("promtool missing (apt-get install prometheus)")
    result = subprocess.run(
        [promtool, "check", "config", "--syntax-only", str(GRAFANA_DIR / "prometheus.yml")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_tempo_accepts_the_trace_of_a_large_step() -> None:
    tempo = yaml.safe_load((GRAFANA_DIR / "tempo.yaml").read_text())
    assert tempo["storage"]["trace"]["backend"] == "local"
    # One trace per step: 1024 ranks x ~105 spans (DDP with ~100 buckets) x ~290 bytes per
    # annotated span (measured through otelcol-skewtrace), with 50% headroom. Tempo's default
    # (5 MB) would cut such a step at ~170 ranks.
    step_trace_bytes = 1024 * 105 * 290
    assert tempo["overrides"]["defaults"]["global"]["max_bytes_per_trace"] >= 1.5 * step_trace_bytes


def test_grafana_mounts_provisioning(compose: dict[str, Any]) -> None:
    mounts = {v.split(":")[1]: v.split(":")[0] for v in compose["services"]["grafana"]["volumes"]}
    assert mounts["/etc/grafana/provisioning"] == "./provisioning"
    home = compose["services"]["grafana"]["environment"][
        "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"
    ]
    directory, _, filename = home.rpartition("/")
    assert (GRAFANA_DIR / mounts[directory] / filename).is_file()

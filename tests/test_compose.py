"""Checks ``grafana/docker-compose.yaml`` against what ``docs/viewing.md`` promises.

No Docker engine runs here, so the file is read the way Compose reads it (YAML plus Compose's
``${VAR:-default}`` interpolation, and the merge of an override file) and checked for: the five
services, build files and bind mounts that exist, the published ports of the docs' table and
nothing else, every port bound to 127.0.0.1 (no variable alone publishes anything), the
network override (``docker-compose.network.yaml``) refusing to start without a credential for
every port it publishes, and settings that must agree across files (the Collector's env vars
exist in its configs, the pacer's are flags it knows, Prometheus and Tempo are configured the
way the dashboard needs).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
GRAFANA_DIR = REPO_ROOT / "grafana"
COMPOSE_PATH = GRAFANA_DIR / "docker-compose.yaml"
NETWORK_OVERRIDE_PATH = GRAFANA_DIR / "docker-compose.network.yaml"
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


class Override(list):  # type: ignore[type-arg]
    """A sequence tagged ``!override``: replaces the base file's instead of adding to it."""


class _ComposeLoader(yaml.SafeLoader):
    pass


_ComposeLoader.add_constructor(
    "!override", lambda loader, node: Override(loader.construct_sequence(node))
)


def _read(path: Path, env: Mapping[str, str]) -> dict[str, Any]:
    return dict(yaml.load(interpolate(path.read_text(), env), Loader=_ComposeLoader))


def merge_service(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Compose's merge of one service, for the keys these files use: mappings merge, command
    is replaced, volumes merge by container path, ports add up unless tagged ``!override``."""
    merged = dict(base)
    for key, value in override.items():
        if key in ("environment", "build") and key in merged:
            merged[key] = {**merged[key], **value}
        elif key == "volumes":
            by_target = {str(v).split(":")[1]: v for v in merged.get(key, [])}
            by_target.update({str(v).split(":")[1]: v for v in value})
            merged[key] = list(by_target.values())
        elif key == "ports" and not isinstance(value, Override):
            merged[key] = [*merged.get(key, []), *value]
        else:
            merged[key] = list(value) if isinstance(value, Override) else value
    return merged


def load_compose(
    env: Mapping[str, str] | None = None, *, overrides: tuple[Path, ...] = ()
) -> dict[str, Any]:
    """The compose model after interpolation (per file, as Compose does) and merging."""
    env = env or {}
    compose = _read(COMPOSE_PATH, env)
    for path in overrides:
        for name, service in _read(path, env).get("services", {}).items():
            compose["services"][name] = merge_service(compose["services"].get(name, {}), service)
    return compose


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


@pytest.mark.parametrize("network", [False, True], ids=["local", "network"])
def test_builds_and_mounts_exist(network: bool) -> None:
    compose = _network_compose(NETWORK_CREDENTIALS) if network else load_compose()
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


def test_no_variable_alone_publishes_on_the_network() -> None:
    """Without the network override nothing leaves the host, whatever the environment says;
    host ports can still be moved."""
    compose = load_compose({"SKEWTRACE_BIND_ADDRESS": "0.0.0.0", "SKEWTRACE_GRAFANA_PORT": "3001"})
    ports = published_ports(compose)
    assert {ip for _, ip, _, _ in ports} == {"127.0.0.1"}
    assert ("grafana", "127.0.0.1", 3001, 3000) in ports


# -- docker-compose.network.yaml -----------------------------------------------------------

NETWORK_CREDENTIALS = {
    "SKEWTRACE_OTLP_TOKEN": "otlp-token",
    "SKEWTRACE_PACER_TOKEN": "pacer-token",
    "GF_SECURITY_ADMIN_PASSWORD": "a-real-password",
    # Any existing directory: it is mounted, not read, here.
    "SKEWTRACE_TLS_DIR": str(GRAFANA_DIR),
}


def _network_compose(env: Mapping[str, str]) -> dict[str, Any]:
    return load_compose(env, overrides=(NETWORK_OVERRIDE_PATH,))


@pytest.mark.parametrize("missing", sorted(NETWORK_CREDENTIALS))
def test_network_override_refuses_to_start_without_each_credential(missing: str) -> None:
    for value in (None, ""):
        env = {k: v for k, v in NETWORK_CREDENTIALS.items() if k != missing}
        if value is not None:
            env[missing] = value
        with pytest.raises(ValueError, match=missing):
            _network_compose(env)


def test_network_override_publishes_only_authenticated_ports() -> None:
    compose = _network_compose({**NETWORK_CREDENTIALS, "SKEWTRACE_BIND_ADDRESS": "10.0.0.5"})
    ports = published_ports(compose)
    on_network = {(service, port) for service, ip, port, _ in ports if ip != "127.0.0.1"}
    assert on_network == {
        ("otelcol-skewtrace", 4317),
        ("otelcol-skewtrace", 4318),
        ("pacer", 4320),
        ("grafana", 3000),
    }
    assert {ip for _, ip, _, _ in ports} == {"127.0.0.1", "10.0.0.5"}
    # Each host port once: !override replaced the base file's 127.0.0.1 bindings.
    host_ports = [port for _, _, port, _ in ports]
    assert len(host_ports) == len(set(host_ports)), ports
    assert {(s, ip) for s, ip, _, _ in ports if s in ("prometheus", "tempo")} == {
        ("prometheus", "127.0.0.1"),
        ("tempo", "127.0.0.1"),
    }

    collector = compose["services"]["otelcol-skewtrace"]
    configs = [arg.split("=", 1)[1] for arg in collector["command"]]
    assert "/etc/otelcol-skewtrace/network-auth.yaml" in configs
    mounts = {str(v).split(":")[1]: str(v).split(":")[0] for v in collector["volumes"]}
    tls_dir = "/etc/otelcol-skewtrace/tls"
    assert mounts[tls_dir] == NETWORK_CREDENTIALS["SKEWTRACE_TLS_DIR"]
    environment = collector["environment"]
    assert environment["SKEWTRACE_OTLP_TOKEN"] == "otlp-token"
    assert environment["SKEWTRACE_TLS_CERT_FILE"].startswith(tls_dir + "/")
    assert environment["SKEWTRACE_TLS_KEY_FILE"].startswith(tls_dir + "/")

    grafana = compose["services"]["grafana"]["environment"]
    assert grafana["GF_SECURITY_ADMIN_PASSWORD"] == "a-real-password"
    assert grafana["GF_AUTH_ANONYMOUS_ENABLED"] == "false"


def test_network_override_keeps_pacer_and_collector_talking() -> None:
    """The pacer's token reaches the Collector's exporter, and the pacer's own metrics go to
    the unpublished internal receiver, since 4317 now wants TLS and a token."""
    compose = _network_compose(NETWORK_CREDENTIALS)
    collector = compose["services"]["otelcol-skewtrace"]["environment"]
    pacer = compose["services"]["pacer"]["environment"]
    assert collector["SKEWTRACE_PACER_TOKEN"] == pacer["SKEWTRACE_PACER_TOKEN"] == "pacer-token"
    internal_port = collector["SKEWTRACE_INTERNAL_OTLP_GRPC_ENDPOINT"].rsplit(":", 1)[1]
    assert pacer["SKEWTRACE_PACER_METRICS_ENDPOINT"] == f"otelcol-skewtrace:{internal_port}"
    published = {container for _, _, _, container in published_ports(compose)}
    assert int(internal_port) not in published


def test_local_stack_sends_the_pacer_token_it_sets() -> None:
    compose = load_compose({"SKEWTRACE_PACER_TOKEN": "t"})
    services = compose["services"]
    assert services["otelcol-skewtrace"]["environment"]["SKEWTRACE_PACER_TOKEN"] == "t"
    assert services["pacer"]["environment"]["SKEWTRACE_PACER_TOKEN"] == "t"


@pytest.mark.parametrize("network", [False, True], ids=["local", "network"])
def test_collector_env_vars_exist_in_its_config(network: bool) -> None:
    """Each variable compose sets for the Collector is read by one of the configs it mounts,
    so renaming one there cannot silently leave the stack on defaults."""
    compose = _network_compose(NETWORK_CREDENTIALS) if network else load_compose()
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


@pytest.mark.parametrize("network", [False, True], ids=["local", "network"])
def test_pacer_env_vars_are_flags_it_knows(network: bool) -> None:
    from skewtrace.cli import _PACER_OPTIONS

    compose = _network_compose(NETWORK_CREDENTIALS) if network else load_compose()
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


@pytest.mark.prometheus
def test_prometheus_config_passes_promtool(promtool_binary: str) -> None:
    promtool = promtool_binary
    result = subprocess.run(
        [promtool, "check", "config", "--syntax-only", str(GRAFANA_DIR / "prometheus.yml")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_stored_traces_fit_tempos_default_limit() -> None:
    """Tempo keeps its default max_bytes_per_trace (5 MB); the Collector's traceshape
    processor bounds every stored trace to max_trace_spans spans, which must fit it at a
    generous 600 bytes per span (an annotated span measures ~250-290: the Go test
    TestLargeJobShapeAt4096Ranks checks the stored sizes themselves)."""
    tempo = yaml.safe_load((GRAFANA_DIR / "tempo.yaml").read_text())
    assert tempo["storage"]["trace"]["backend"] == "local"
    tempo_limit = (
        tempo["overrides"]["defaults"].get("global", {}).get("max_bytes_per_trace", 5_000_000)
    )
    assert tempo_limit <= 5_000_000
    config = yaml.safe_load((REPO_ROOT / "collector-config" / "otelcol.yaml").read_text())
    match = re.fullmatch(
        r"\$\{env:\w+:-(\d+)\}", str(config["processors"]["traceshape"]["max_trace_spans"])
    )
    assert match, config["processors"]["traceshape"]
    assert int(match.group(1)) * 600 < tempo_limit
    backend = config["service"]["pipelines"]["traces/backend"]
    assert "traceshape" in backend["processors"]
    assert "otlp_grpc/backend" in backend["exporters"]


def test_grafana_mounts_provisioning(compose: dict[str, Any]) -> None:
    mounts = {v.split(":")[1]: v.split(":")[0] for v in compose["services"]["grafana"]["volumes"]}
    assert mounts["/etc/grafana/provisioning"] == "./provisioning"
    home = compose["services"]["grafana"]["environment"][
        "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"
    ]
    directory, _, filename = home.rpartition("/")
    assert (GRAFANA_DIR / mounts[directory] / filename).is_file()

"""Topology discovery: switch from env or topology files, NIC from env or routing, GPU
attributes. Files are real files (fixtures in tests/data/topology or written to tmp_path);
routing uses the real kernel (loopback here, and a veth pair in a network namespace the
test creates)."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import types
import uuid
from pathlib import Path
from typing import Any

import pytest

from skewtrace.rank import topology
from skewtrace.rank.topology import (
    TopologyError,
    TopologyInfo,
    discover_nic,
    discover_topology,
    gpu_attributes,
)
from skewtrace.rank.topology import gpu as topology_gpu
from skewtrace.rank.topology import nic as topology_nic
from skewtrace.semconv import GPU_NAME, GPU_NUMA_NODE, GPU_PCI_BUS_ID, GPU_UUID, UNKNOWN

DATA = Path(__file__).parent / "data" / "topology"

# Keep NIC discovery off the routing table unless a test asks for it, so switch tests
# do not depend on the machine's interfaces.
NO_ROUTE = {"SKEWTRACE_NIC": "test-nic"}


def env_with(path: Path | str, **extra: str) -> dict[str, str]:
    return {"SKEWTRACE_TOPOLOGY": str(path), **NO_ROUTE, **extra}


# --------------------------------------------------------------------------------------
# Slurm topology.conf


@pytest.mark.parametrize(
    ("host", "switch", "path"),
    [
        ("node01", "leaf1", ("leaf1", "spine1", "core")),
        ("node04", "leaf1", ("leaf1", "spine1", "core")),
        ("node07", UNKNOWN, ()),  # not in node[05-06,08]
        ("node08", "leaf2", ("leaf2", "spine1", "core")),
        ("gpu-a2-ib", "leaf2", ("leaf2", "spine1", "core")),
        # Listed over a continuation line, and after a continued comma.
        ("rack2-n01", "leaf3", ("leaf3", "spine2", "core")),
        ("big003", "leaf3", ("leaf3", "spine2", "core")),
        ("quoted2", "leaf4", ("leaf4", "spine2", "core")),
        # A fully qualified host name matches the short name in the file.
        ("node02.cluster.example.org", "leaf1", ("leaf1", "spine1", "core")),
    ],
)
def test_slurm_topology_conf(host: str, switch: str, path: tuple[str, ...]) -> None:
    conf = DATA / "slurm_tree.conf"
    info = discover_topology(host, env_with(conf))
    assert info.switch == switch
    assert info.switch_path == path
    assert info.nic == "test-nic"
    assert info.source == (f"file:{conf}" if switch != UNKNOWN else UNKNOWN)


def test_slurm_node_name_differs_from_host_name() -> None:
    info = discover_topology(
        "ip-10-0-0-7", env_with(DATA / "slurm_tree.conf", SLURMD_NODENAME="node05")
    )
    assert info.switch == "leaf2"


def test_slurm_escaped_hash_is_not_a_comment(tmp_path: Path) -> None:
    conf = tmp_path / "topology.conf"
    conf.write_text("SwitchName=leaf\\#1 Nodes=n1  # the rest is a comment\n")
    assert discover_topology("n1", env_with(conf)).switch == "leaf#1"


def test_tree_leaf_wins_over_block() -> None:
    conf = DATA / "slurm_tree_and_block.conf"
    assert discover_topology("node01", env_with(conf)).switch == "leaf1"
    assert discover_topology("node03", env_with(conf)).switch == "b1"
    assert discover_topology("node08", env_with(conf)).switch == "b2"


def test_slurm_topology_yaml_prefers_the_tree() -> None:
    conf = DATA / "slurm_topology.yaml"
    info = discover_topology("node03", env_with(conf))
    assert info == TopologyInfo("leaf2", "test-nic", ("leaf2", "spine2", "core"), f"file:{conf}")


def test_default_slurm_path_next_to_slurm_conf(tmp_path: Path) -> None:
    slurm_conf = tmp_path / "slurm.conf"
    env = {"SLURM_CONF": str(slurm_conf), **NO_ROUTE}
    # No topology file at all: not an error, and nothing to warn about.
    assert discover_topology("node01", env).switch == UNKNOWN
    shutil.copy(DATA / "slurm_tree.conf", tmp_path / "topology.conf")
    assert discover_topology("node01", env).switch == "leaf1"
    # Slurm reads topology.yaml in preference to topology.conf; so do we.
    shutil.copy(DATA / "slurm_topology.yaml", tmp_path / "topology.yaml")
    assert discover_topology("node03", env).switch == "leaf2"


def test_missing_default_file_is_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(topology, "DEFAULT_SLURM_TOPOLOGY", "/nonexistent/slurm/topology.conf")
    assert discover_topology("node01", dict(NO_ROUTE)) == TopologyInfo(UNKNOWN, "test-nic")


def test_missing_explicit_file_is_an_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.conf"
    with pytest.raises(TopologyError, match=f"^{missing}:0: SKEWTRACE_TOPOLOGY"):
        discover_topology("node01", env_with(missing))


# --------------------------------------------------------------------------------------
# skewtrace's YAML/JSON format


@pytest.mark.parametrize("name", ["skewtrace.yaml", "skewtrace.json"])
@pytest.mark.parametrize(
    ("host", "local_rank", "switch", "nic", "path"),
    [
        ("node03", 0, "leaf1", "mlx5_0", ("leaf1", "spine1", "core")),
        # One NIC per local rank.
        ("node05", 2, "leaf2", "mlx5_2", ("leaf2", "spine1", "core")),
        ("node05", 5, "leaf2", "mlx5_1", ("leaf2", "spine1", "core")),
        # NIC only: the exact entry wins, its switch stays unknown.
        ("node06", 0, UNKNOWN, "ib0", ()),
        ("gpu-b17", 0, "leaf3", "mlx5_4", ("leaf3", "spine2", "core")),
        ("anything-else", 0, "catch-all", UNKNOWN, ("catch-all",)),
    ],
)
def test_structured_topology_file(
    name: str, host: str, local_rank: int, switch: str, nic: str, path: tuple[str, ...]
) -> None:
    env = {"SKEWTRACE_TOPOLOGY": str(DATA / name)}
    info = discover_topology(host, env, local_rank=local_rank)
    assert (info.switch, info.nic, info.switch_path) == (switch, nic, path)


def test_local_rank_from_env() -> None:
    env = {"SKEWTRACE_TOPOLOGY": str(DATA / "skewtrace.yaml"), "LOCAL_RANK": "3"}
    assert discover_topology("node05", env).nic == "mlx5_3"
    env = {"SKEWTRACE_TOPOLOGY": str(DATA / "skewtrace.yaml"), "SLURM_LOCALID": "1"}
    assert discover_topology("node05", env).nic == "mlx5_1"


def test_file_nic_ranks_below_nccl_env_and_above_routing() -> None:
    env = {"SKEWTRACE_TOPOLOGY": str(DATA / "skewtrace.yaml"), "MASTER_ADDR": "127.0.0.1"}
    assert discover_topology("node01", env).nic == "mlx5_0"
    env["NCCL_IB_HCA"] = "mlx5_9:1"
    assert discover_topology("node01", env).nic == "mlx5_9"


def test_reparsed_when_the_file_changes(tmp_path: Path) -> None:
    conf = tmp_path / "topology.conf"
    conf.write_text("SwitchName=leaf1 Nodes=node01\n")
    assert discover_topology("node01", env_with(conf)).switch == "leaf1"
    conf.write_text("SwitchName=leafB Nodes=node[01-02]\n")
    os.utime(conf, ns=(1, 10**18))  # a distinct mtime even on coarse clocks
    assert discover_topology("node01", env_with(conf)).switch == "leafB"


# --------------------------------------------------------------------------------------
# Malformed files name the file and line


MALFORMED = [
    # Slurm topology.conf
    (
        "bad.conf",
        "SwitchName=leaf1 Nodes=n[1-2]\n# fine\nSwitchName=leaf2 Nodes=n[3-\n",
        3,
        "unclosed",
    ),
    ("bad.conf", "SwitchName=leaf1 Nodes=n[5-3]\n", 1, "runs backwards"),
    ("bad.conf", "SwitchName=leaf1 Nodes=n1\nSwitchName=leaf1 Nodes=n2\n", 2, "already defined"),
    ("bad.conf", "SwitchName=s1 Nodes=n1\n\nSwitchName=s2 Switches=s[1-3]\n", 3, "'s3' is not"),
    ("bad.conf", "SwitchName=s1 Nodez=n1\n", 1, "unknown key 'Nodez'"),
    ("bad.conf", "SwitchName=s1 Nodes=n1 stray\n", 1, "expected Key=Value"),
    ("bad.conf", "SwitchName=s1\nSwitchName=s2 Nodes=\n", 2, "Nodes has no value"),
    ("bad.conf", "SwitchName=s1 Nodes=n1\nNodes=n2 SwitchName=s2\n", 2, "must start with"),
    # A continued line is reported at its first physical line.
    ("bad.conf", "# c\nSwitchName=s1 \\\n  Nodes=n[1-\n", 2, "unclosed"),
    # skewtrace YAML
    ("bad.yaml", "nodes:\n  node01: {switch: leaf1\n", 3, "invalid YAML"),
    ("bad.yaml", "nodes:\n  node01: {switch: leaf1}\n  node01: {switch: leaf2}\n", 3, "duplicate"),
    ("bad.yaml", "nodes:\n  n[1-2]: {switch: a}\n  n2: {switch: b}\n", 3, "listed twice"),
    ("bad.yaml", "nodes:\n  node01: {swtich: leaf1}\n", 2, "unknown key 'swtich'"),
    ("bad.yaml", "nodes:\n  node01: {}\n", 2, "needs a switch or a nic"),
    ("bad.yaml", "nodes:\n  node[1-: {switch: a}\n", 2, "unclosed"),
    ("bad.yaml", "nodes:\n  node01:\n    switch: [a, b]\n", 3, "must be a non-empty string"),
    ("bad.yaml", "nodes:\n  n1: {nic: []}\n", 2, "nic list"),
    ("bad.yaml", "nodes:\n  n1: {switch: ~}\n", 2, "non-empty string"),
    ("bad.yaml", "nodes:\n  n1:\n    switch:\n", 3, "non-empty string"),
    ("bad.yaml", "nodes: {}\nracks: {}\n", 2, "unknown section 'racks'"),
    ("bad.yaml", "patterns:\n  - {switch: a}\n", 2, "needs match"),
    ("bad.yaml", "patterns: {a: b}\n", 1, "must be a list"),
    ("bad.yaml", "# only a comment\n", 1, "empty"),
    ("bad.yaml", "just a string\n", 1, "must be a mapping"),
    # skewtrace JSON
    ("bad.json", '{\n  "nodes": {\n    "n1": {"switch": "a"},\n  }\n}\n', 4, "invalid JSON"),
    ("bad.json", '{\n  "nodes": {\n    "n1": {"switch": null}\n  }\n}\n', 3, "non-empty string"),
    # Slurm topology.yaml
    (
        "topology.yaml",
        "- topology: t\n  tree:\n    switches:\n      - nodes: n1\n",
        4,
        "needs switch",
    ),
    (
        "topology.yaml",
        "- topology: t\n  tree: {switches: [{switch: s, nodes: 'n[2-1]'}]}\n",
        2,
        "backwards",
    ),
    ("topology.yaml", "- tree: {switches: []}\n", 1, "needs topology"),
]


@pytest.mark.parametrize(("name", "text", "line", "fragment"), MALFORMED)
def test_malformed_file_names_file_and_line(
    tmp_path: Path, name: str, text: str, line: int, fragment: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TopologyError) as info:
        discover_topology("node01", env_with(path))
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: "), message
    assert fragment in message


def test_format_is_sniffed_without_an_extension(tmp_path: Path) -> None:
    for source in ("slurm_tree.conf", "skewtrace.json", "skewtrace.yaml"):
        path = tmp_path / f"topo-{source.replace('.', '-')}"
        shutil.copy(DATA / source, path)
        assert discover_topology("node02", env_with(path)).switch == "leaf1", source


def test_malformed_default_file_not_read_when_switch_is_given(tmp_path: Path) -> None:
    (tmp_path / "topology.conf").write_text("SwitchName=broken Nodes=n[1-\n")
    env = {"SLURM_CONF": str(tmp_path / "slurm.conf"), **NO_ROUTE}
    with pytest.raises(TopologyError):
        discover_topology("n1", env)
    env["SKEWTRACE_SWITCH"] = "leaf-env"
    assert discover_topology("n1", env).switch == "leaf-env"


# --------------------------------------------------------------------------------------
# Unknown node: one warning per process


def test_unknown_node_warns_exactly_once(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    conf = tmp_path / "topology.conf"
    conf.write_text("SwitchName=leaf1 Nodes=node01\n")
    host = f"stranger-{uuid.uuid4().hex[:8]}"
    with caplog.at_level(logging.WARNING, logger="skewtrace.rank.topology"):
        for _ in range(3):
            assert discover_topology(host, env_with(conf)).switch == UNKNOWN
        assert discover_topology("node01", env_with(conf)).switch == "leaf1"
    warnings = [record for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert host in warnings[0].getMessage()
    assert str(conf) in warnings[0].getMessage()


# --------------------------------------------------------------------------------------
# Precedence of the switch and NIC sources


def test_switch_env_wins_over_file() -> None:
    env = env_with(DATA / "slurm_tree.conf", SKEWTRACE_SWITCH="leaf-from-env")
    info = discover_topology("node01", env)
    assert info.switch == "leaf-from-env"
    assert info.source == "env"


def test_switch_env_keeps_the_file_path_above_it() -> None:
    env = env_with(DATA / "slurm_tree.conf", SKEWTRACE_SWITCH="leaf2")
    assert discover_topology("node01", env).switch_path == ("leaf2", "spine1", "core")


@pytest.mark.parametrize(
    ("env", "nic"),
    [
        ({"SKEWTRACE_NIC": "nic-env", "NCCL_IB_HCA": "mlx5_0"}, "nic-env"),
        ({"NCCL_IB_HCA": "mlx5_0:1,mlx5_1:1", "NCCL_SOCKET_IFNAME": "ib0"}, "mlx5_0"),
        ({"NCCL_IB_HCA": "=mlx5_3:1", "GLOO_SOCKET_IFNAME": "ib0"}, "mlx5_3"),
        ({"NCCL_IB_HCA": "mlx5_3", "NCCL_SOCKET_IFNAME": "ib0"}, "mlx5_3"),
        # An exclusion list says which HCAs are *not* used: it names no NIC.
        ({"NCCL_IB_HCA": "^mlx5_2", "NCCL_SOCKET_IFNAME": "ib0"}, "ib0"),
        ({"NCCL_IB_HCA": "^=mlx5_2", "GLOO_SOCKET_IFNAME": "ib1"}, "ib1"),
        ({"NCCL_SOCKET_IFNAME": "ib0,ib1", "GLOO_SOCKET_IFNAME": "eth9"}, "ib0"),
        ({"NCCL_SOCKET_IFNAME": "^docker,lo", "GLOO_SOCKET_IFNAME": "eth9"}, "eth9"),
        ({"GLOO_SOCKET_IFNAME": " =bond0 "}, "bond0"),
        # A prefix names the real interface it selects: "l" matches "lo" here.
        ({"NCCL_SOCKET_IFNAME": "l"}, "lo"),
        ({"NCCL_SOCKET_IFNAME": "^lo"}, UNKNOWN),
        ({"NCCL_IB_HCA": "", "NCCL_SOCKET_IFNAME": " "}, UNKNOWN),
        ({}, UNKNOWN),
    ],
)
def test_nic_from_env(env: dict[str, str], nic: str) -> None:
    assert discover_nic(env) == nic


def test_nic_routes_to_master_addr_over_loopback() -> None:
    assert discover_nic({"MASTER_ADDR": "127.0.0.1"}) == "lo"
    assert discover_nic({"MASTER_ADDR": "localhost", "MASTER_PORT": "29500"}) == "lo"
    # Any 127/8 address is loopback, even one no interface carries.
    assert discover_nic({"MASTER_ADDR": "127.0.0.9"}) == "lo"


@pytest.mark.parametrize(
    "master",
    ["no-such-host.invalid", "300.1.1.1", "", "::ffff:zz", "[::1]"],
)
def test_nic_discovery_never_raises(master: str) -> None:
    assert discover_nic({"MASTER_ADDR": master, "MASTER_PORT": "not-a-port"}) == UNKNOWN


def test_nic_from_route_table_parsing(tmp_path: Path) -> None:
    route = tmp_path / "route"
    route.write_text(
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
        "eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
        "ib0\t0000000A\t00000000\t0001\t0\t0\t0\t000000FF\t0\t0\t0\n"
        "ib1\t0007000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
    )
    assert topology_nic._route_interface("10.0.7.3", str(route)) == "ib1"
    assert topology_nic._route_interface("10.1.2.3", str(route)) == "ib0"
    assert topology_nic._route_interface("8.8.8.8", str(route)) == "eth0"


NETNS_SCRIPT = """
import json, sys
from skewtrace.rank.topology import discover_nic
print(json.dumps([discover_nic(dict(pair.split("=", 1) for pair in case)) for case in
      json.loads(sys.argv[1])]))
"""


@pytest.mark.netns
def test_nic_routes_to_master_addr_over_a_veth(tmp_path: Path, namespaces: None) -> None:
    """A real non-loopback route: a namespace with a veth pair, discovery run inside."""
    namespace = f"skt-topo-{uuid.uuid4().hex[:8]}"

    def ip(*args: str) -> None:
        subprocess.run(["ip", "-n", namespace, *args], check=True, capture_output=True)

    subprocess.run(["ip", "netns", "add", namespace], check=True, capture_output=True)
    try:
        ip("link", "add", "sktfab0", "type", "veth", "peer", "name", "sktpeer0")
        ip("addr", "add", "198.18.7.1/24", "dev", "sktfab0")
        ip("link", "set", "sktfab0", "up")
        ip("link", "set", "sktpeer0", "up")
        ip("link", "set", "lo", "up")
        ip("route", "add", "198.19.0.0/16", "via", "198.18.7.2", "dev", "sktfab0")
        cases = [
            ["MASTER_ADDR=198.18.7.2"],  # on the link
            ["MASTER_ADDR=198.19.40.1"],  # through a gateway
            ["MASTER_ADDR=127.0.0.1"],
            ["NCCL_SOCKET_IFNAME=sktfab"],  # prefix to the real name
            ["MASTER_ADDR=203.0.113.5"],  # no route at all
        ]
        import json

        result = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                namespace,
                sys.executable,
                "-c",
                NETNS_SCRIPT,
                json.dumps(cases),
            ],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert json.loads(result.stdout) == ["sktfab0", "sktfab0", "lo", "sktfab0", UNKNOWN]
    finally:
        subprocess.run(["ip", "netns", "del", namespace], check=False, capture_output=True)


# --------------------------------------------------------------------------------------
# GPU attributes


def test_gpu_attributes_empty_without_gpu(caplog: pytest.LogCaptureFixture) -> None:
    """This machine has no GPU driver (and may or may not have pynvml): no attributes,
    no error, no warning."""
    with caplog.at_level(logging.INFO):
        assert gpu_attributes(0) == {}
        assert gpu_attributes(0) == {}
        assert gpu_attributes(None) == {}
    assert [r for r in caplog.records if r.name.startswith("skewtrace")] == []


class FakeNvml(types.SimpleNamespace):
    """A stand-in for pynvml: there is no GPU or NVIDIA driver on the CI machine, so the
    mapping from local device index to physical GPU is tested against this fake."""

    def __init__(self, devices: list[dict[str, Any]], numa_supported: bool = True) -> None:
        super().__init__()
        self.devices = devices
        if not numa_supported:
            self.nvmlDeviceGetNumaNodeId = None

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> dict[str, Any]:
        return self.devices[index]

    def nvmlDeviceGetHandleByUUID(self, value: str) -> dict[str, Any]:
        return next(d for d in self.devices if d["uuid"] == value)

    def nvmlDeviceGetUUID(self, handle: dict[str, Any]) -> str:
        return str(handle["uuid"])

    def nvmlDeviceGetName(self, handle: dict[str, Any]) -> bytes:
        return b"NVIDIA H100 80GB HBM3"  # older pynvml returns bytes

    def nvmlDeviceGetPciInfo(self, handle: dict[str, Any]) -> types.SimpleNamespace:
        return types.SimpleNamespace(busId=handle["bus"])

    def nvmlDeviceGetNumaNodeId(self, handle: dict[str, Any]) -> int:
        if handle["numa"] is None:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return int(handle["numa"])


DEVICES = [
    {"uuid": "GPU-aaaa0000-0000", "bus": "00000000:1B:00.0", "numa": 0},
    {"uuid": "GPU-bbbb1111-1111", "bus": "00000000:3B:00.0", "numa": None},
    {"uuid": "GPU-cccc2222-2222", "bus": "00000001:DB:00.0", "numa": 1},
]


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    nvml = FakeNvml(DEVICES)
    monkeypatch.setitem(topology_gpu._nvml_state, "module", nvml)
    return nvml


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    for bus, numa in (("0000:1b:00.0", "0"), ("0000:3b:00.0", "1"), ("0001:db:00.0", "-1")):
        device = tmp_path / "bus" / "pci" / "devices" / bus
        device.mkdir(parents=True)
        (device / "numa_node").write_text(f"{numa}\n")
    return tmp_path


@pytest.mark.parametrize(
    ("visible", "index", "uuid", "numa"),
    [
        (None, 0, "GPU-aaaa0000-0000", 0),
        # NVML has no NUMA id for this one: sysfs gives it.
        (None, 1, "GPU-bbbb1111-1111", 1),
        ("2,1", 0, "GPU-cccc2222-2222", 1),
        ("2,1", 1, "GPU-bbbb1111-1111", 1),
        # CUDA takes UUIDs and unique UUID prefixes.
        ("GPU-cccc2222-2222,GPU-aaaa", 1, "GPU-aaaa0000-0000", 0),
        (" GPU-bbbb ", 0, "GPU-bbbb1111-1111", 1),
    ],
)
def test_gpu_attributes_follow_cuda_visible_devices(
    fake_nvml: FakeNvml, sysfs: Path, visible: str | None, index: int, uuid: str, numa: int
) -> None:
    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    attributes = gpu_attributes(index, env=env, sysfs_root=str(sysfs))
    bus = next(d["bus"] for d in DEVICES if d["uuid"] == uuid)
    assert attributes == {
        GPU_UUID: uuid,
        GPU_NAME: "NVIDIA H100 80GB HBM3",
        GPU_PCI_BUS_ID: bus,
        GPU_NUMA_NODE: numa,
    }


def test_gpu_numa_left_out_when_unknown(monkeypatch: pytest.MonkeyPatch, sysfs: Path) -> None:
    nvml = FakeNvml([{**DEVICES[2], "numa": None}], numa_supported=False)
    monkeypatch.setitem(topology_gpu._nvml_state, "module", nvml)
    attributes = gpu_attributes(0, env={}, sysfs_root=str(sysfs))
    assert attributes[GPU_UUID] == "GPU-cccc2222-2222"
    assert GPU_NUMA_NODE not in attributes  # sysfs says -1


@pytest.mark.parametrize("visible", ["0", "GPU-ffff", ""])
def test_gpu_attributes_bad_mapping_is_empty_not_an_error(
    fake_nvml: FakeNvml, visible: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="skewtrace.rank.topology"):
        assert gpu_attributes(1, env={"CUDA_VISIBLE_DEVICES": visible}) == {}
    assert len(caplog.records) == 1

"""An emulated leaf/spine cluster on one Linux machine: nodes are network namespaces.

::

                          spine (bridge)
              sp0 |           sp1 |           sp2 |        uplinks: veth pairs, tbf both ways
              up0 |           up1 |           up2 |
           leaf0 (bridge)  leaf1 (bridge)  leaf2 (bridge)
            n0 |   n1 |     n2 |   n3 |     n4 |   n5 |    node ports: veth pairs, tbf both ways
          node0  node1    node2  node3    node4  node5     (namespaces; NIC ``eth0``)

The bridges live in a namespace of their own (``<prefix>-fab``), so nothing is added to
the machine's own namespace. Traffic between nodes of one leaf crosses only their ports;
traffic between leaves also crosses both leaves' uplinks, which are shaped to
``uplink_mbit`` (by default the rate of one NIC: two nodes per leaf make a 2:1
oversubscribed uplink), so collectives across leaves really contend.

A second, unshaped network (bridge ``mgmt``, ``mgmt0`` in every node) joins the nodes to
the operations namespace (``<prefix>-ops``) where the Collector and the pacer run: telemetry
does not share the links it measures, as on a real cluster's management network.

Every name starts with ``skt-<pid>-`` (the pid of the process that made it), so
:func:`remove_stale` can find what a killed run left and remove it.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from skewtrace.cluster import netns

PREFIX = "skt"
_OWNED = re.compile(rf"^{PREFIX}-(\d+)-")
DATA_NET = "10.77"
MGMT_NET = "10.78"
OPS_MGMT_IP = f"{MGMT_NET}.255.254"
NIC = "eth0"
UPLINK_SHARING = ("fifo", "fair")
MGMT_NIC = "mgmt0"
TCP_SEND_BUFFER = 65536
"""The nodes' largest TCP send buffer (bytes): a gloo send of a larger message lasts about
as long as its transfer, so the Collector sees slow links in point-to-point sends too."""


@dataclass(frozen=True)
class FabricSpec:
    leaves: int = 3
    nodes_per_leaf: int = 2
    ranks_per_node: int = 1
    nic_mbit: float = 800.0
    uplink_mbit: float = 800.0
    uplink_sharing: str = "fifo"
    """How an uplink shares its rate among the nodes sending over it. ``fifo``: one
    tail-drop queue (a tbf) for all of them. ``fair``: an equal share for every node's
    traffic, borrowing what idle nodes leave (htb classes per source address), as a fabric
    whose congestion control gives each flow its fair rate (RoCE with DCQCN, fair queuing).
    On ``benchmarks/collision.py``'s jobs a collision held in place costs a third of a step
    with ``fifo``, and with ``fair`` the jobs take turns within seconds however they start
    (``docs/evaluation.md``)."""

    def __post_init__(self) -> None:
        if self.leaves < 1 or self.nodes_per_leaf < 1 or self.ranks_per_node < 1:
            raise ValueError("leaves, nodes per leaf and ranks per node must be >= 1")
        if self.nodes < 1 or self.nodes > 250:
            raise ValueError(f"{self.nodes} nodes: the emulated fabric holds 1 to 250")
        if self.nic_mbit <= 0 or self.uplink_mbit <= 0:
            raise ValueError("link rates must be > 0 Mbit/s")
        if self.uplink_sharing not in UPLINK_SHARING:
            raise ValueError(
                f"uplink sharing {self.uplink_sharing!r}: one of {', '.join(UPLINK_SHARING)}"
            )

    @property
    def nodes(self) -> int:
        return self.leaves * self.nodes_per_leaf

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node


@dataclass(frozen=True)
class Node:
    index: int
    name: str
    leaf: str
    namespace: str
    data_ip: str
    mgmt_ip: str
    port: str
    """The node's port on its leaf (the switch side of its NIC's cable), in the fabric
    namespace."""
    ranks: tuple[int, ...]


@dataclass
class Fabric:
    """The cluster; :meth:`create` builds it, :meth:`remove` takes all of it down."""

    spec: FabricSpec
    owner: int = field(default_factory=os.getpid)
    nodes: list[Node] = field(init=False)
    created: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        s = self.spec
        self.nodes = [
            Node(
                index=i,
                name=f"node{i}",
                leaf=f"leaf{i // s.nodes_per_leaf}",
                namespace=f"{self.prefix}node{i}",
                data_ip=f"{DATA_NET}.{i // 250}.{i % 250 + 1}",
                mgmt_ip=f"{MGMT_NET}.{i // 250}.{i % 250 + 1}",
                port=f"n{i}",
                ranks=tuple(range(i * s.ranks_per_node, (i + 1) * s.ranks_per_node)),
            )
            for i in range(s.nodes)
        ]

    @property
    def prefix(self) -> str:
        return f"{PREFIX}-{self.owner}-"

    @property
    def fabric_ns(self) -> str:
        return f"{self.prefix}fab"

    @property
    def ops_ns(self) -> str:
        return f"{self.prefix}ops"

    @property
    def leaves(self) -> list[str]:
        return [f"leaf{i}" for i in range(self.spec.leaves)]

    def namespaces(self) -> list[str]:
        return [self.fabric_ns, self.ops_ns, *(n.namespace for n in self.nodes)]

    def node_of_rank(self, rank: int) -> Node:
        return self.nodes[rank // self.spec.ranks_per_node]

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"no node {name!r} (nodes: node0..node{len(self.nodes) - 1})")

    # The Placement protocol of skewtrace.cluster.scenarios.
    @property
    def world_size(self) -> int:
        return self.spec.world_size

    @property
    def emulates_network(self) -> bool:
        return True

    def ranks_of_node(self, node: str) -> list[int]:
        return [r for n in self.nodes if n.name == node for r in n.ranks]

    def nodes_of_switch(self, switch: str) -> list[str]:
        return [n.name for n in self.nodes if n.leaf == switch]

    def host_of_rank(self, rank: int) -> str:
        return self.node_of_rank(rank).name

    def switch_of_rank(self, rank: int) -> str:
        return self.node_of_rank(rank).leaf

    def create(self) -> Fabric:
        """Build namespaces, bridges, links, addresses and the baseline shaping. On failure
        whatever was made is removed before the error propagates."""
        try:
            self._create()
        except BaseException:
            self.remove()
            raise
        self.created = True
        return self

    def _create(self) -> None:
        fab = self.fabric_ns
        for ns in self.namespaces():
            netns.add_namespace(ns)
        for bridge in [*self.leaves, "spine", "mgmt"]:
            netns.run(["ip", "-n", fab, "link", "add", bridge, "type", "bridge"])
            netns.run(["ip", "-n", fab, "link", "set", bridge, "up"])
        for i, leaf in enumerate(self.leaves):
            up, down = f"up{i}", f"sp{i}"
            netns.run(["ip", "-n", fab, "link", "add", up, "type", "veth", "peer", "name", down])
            netns.run(["ip", "-n", fab, "link", "set", up, "master", leaf, "up"])
            netns.run(["ip", "-n", fab, "link", "set", down, "master", "spine", "up"])
        for node in self.nodes:
            self._attach(node.namespace, node.port, NIC, node.leaf, f"{node.data_ip}/16")
            self._attach(node.namespace, f"m{node.index}", MGMT_NIC, "mgmt", f"{node.mgmt_ip}/16")
        self._attach(self.ops_ns, "mops", MGMT_NIC, "mgmt", f"{OPS_MGMT_IP}/16")
        for node in self.nodes:
            # A send lasts until its data is nearly out, as an RDMA send does, rather than
            # returning as soon as Linux's autotuned buffer (up to 4 MiB) took a message.
            netns.run(["ip", "netns", "exec", node.namespace, "sysctl", "-q", "-w",
                       f"net.ipv4.tcp_wmem=4096 16384 {TCP_SEND_BUFFER}"])  # fmt: skip
            self.set_nic_rate(node.name, None)
        for leaf in self.leaves:
            self.set_uplink_rate(leaf, None)

    def _attach(self, ns: str, port: str, inside: str, bridge: str, address: str) -> None:
        fab = self.fabric_ns
        netns.run(
            ["ip", "-n", fab, "link", "add", port, "type", "veth", "peer", "name", inside,
             "netns", ns]
        )  # fmt: skip
        netns.run(["ip", "-n", fab, "link", "set", port, "master", bridge, "up"])
        netns.run(["ip", "-n", ns, "addr", "add", address, "dev", inside])
        netns.run(["ip", "-n", ns, "link", "set", inside, "up"])

    def set_nic_rate(self, node_name: str, mbit: float | None) -> None:
        """Shape a node's NIC both ways to ``mbit`` (``None``: back to the spec's rate)."""
        node = self.node(node_name)
        rate = self.spec.nic_mbit if mbit is None else mbit
        netns.set_rate(node.namespace, NIC, rate)
        netns.set_rate(self.fabric_ns, node.port, rate)

    def set_uplink_rate(self, leaf: str, mbit: float | None) -> None:
        """Shape a leaf's uplink both ways to ``mbit`` (``None``: back to the spec's rate)."""
        if leaf not in self.leaves:
            raise KeyError(f"no switch {leaf!r} (switches: {', '.join(self.leaves)})")
        i = self.leaves.index(leaf)
        rate = self.spec.uplink_mbit if mbit is None else mbit
        sources = [node.data_ip for node in self.nodes]
        for device in (f"up{i}", f"sp{i}"):
            if self.spec.uplink_sharing == "fair":
                netns.set_fair_rate(self.fabric_ns, device, rate, sources)
            else:
                netns.set_rate(self.fabric_ns, device, rate)

    def uplink_stats(self, leaf: str) -> dict[str, int]:
        """Bytes and drops leaving the leaf towards the spine."""
        return netns.qdisc_stats(self.fabric_ns, f"up{self.leaves.index(leaf)}")

    def nic_stats(self, node_name: str) -> dict[str, int]:
        """Bytes and drops the node's NIC sent."""
        return netns.qdisc_stats(self.node(node_name).namespace, NIC)

    def topology_conf(self) -> str:
        """The cluster as Slurm's ``topology.conf`` (tree plugin), as a site would write it."""
        lines = ["# written by skewtrace for an emulated leaf/spine fabric"]
        per = self.spec.nodes_per_leaf
        for i, leaf in enumerate(self.leaves):
            first, last = i * per, (i + 1) * per - 1
            nodes = f"node{first}" if first == last else f"node[{first}-{last}]"
            lines.append(f"SwitchName={leaf} Nodes={nodes}")
        leaves = "leaf0" if len(self.leaves) == 1 else f"leaf[0-{len(self.leaves) - 1}]"
        lines.append(f"SwitchName=spine Switches={leaves}")
        return "\n".join(lines) + "\n"

    def write_topology_conf(self, path: Path) -> Path:
        path.write_text(self.topology_conf())
        return path

    def exec_argv(self, node_name: str, argv: list[str]) -> list[str]:
        """``argv`` run inside the node: its network namespace and a UTS namespace whose
        host name is the node's name (what ``socket.gethostname()`` and topology lookup
        see)."""
        node = self.node(node_name)
        return [
            "ip", "netns", "exec", node.namespace,
            "unshare", "--uts", "--",
            "sh", "-c", 'hostname "$0" && exec "$@"', node.name, *argv,
        ]  # fmt: skip

    # What the job runner needs of a cluster (skewtrace.cluster.loopback.Loopback has the
    # same): where ranks and services run and how they reach each other.
    @property
    def master_addr(self) -> str:
        return self.nodes[0].data_ip

    @property
    def service_host(self) -> str:
        """The address ranks reach the Collector and the pacer at (management network)."""
        return OPS_MGMT_IP

    @property
    def driver_netns(self) -> str | None:
        """The namespace the orchestrator enters to read the services."""
        return self.ops_ns

    def rank_argv(self, rank: int, argv: list[str]) -> list[str]:
        return self.exec_argv(self.node_of_rank(rank).name, argv)

    def service_argv(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ops_ns, *argv]

    def rank_env(self, rank: int) -> dict[str, str]:
        """gloo's traffic on the data fabric (not the management network)."""
        return {"MASTER_ADDR": self.master_addr, "GLOO_SOCKET_IFNAME": NIC}

    def describe(self) -> str:
        s = self.spec
        return (
            f"{s.world_size} ranks on {s.nodes} nodes (network namespaces) behind "
            f"{s.leaves} leaf switches and a spine; NICs {s.nic_mbit:g} Mbit/s, uplinks "
            f"{s.uplink_mbit:g} Mbit/s"
            + (", shared fairly by node" if s.uplink_sharing == "fair" else "")
        )

    def remove(self) -> None:
        """Kill every process left in the cluster's namespaces and delete them. Safe to call
        twice and on a half-built cluster."""
        remove_namespaces([ns for ns in netns.list_namespaces() if ns.startswith(self.prefix)])
        self.created = False

    def __enter__(self) -> Fabric:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.remove()


def remove_namespaces(names: list[str]) -> None:
    """SIGTERM, then SIGKILL, the processes in ``names``; then delete the namespaces."""
    for sig, pause in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 0.5)):
        pids = [pid for ns in names for pid in netns.pids_in(ns)]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + pause
        while time.monotonic() < deadline and any(netns.pids_in(ns) for ns in names):
            time.sleep(0.05)
    for ns in names:
        netns.delete_namespace(ns)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> list[str]:
    """Remove the namespaces of earlier runs whose owner process is gone (a killed run);
    return their names."""
    stale = []
    for ns in netns.list_namespaces():
        match = _OWNED.match(ns)
        if match and not _alive(int(match.group(1))):
            stale.append(ns)
    if stale:
        remove_namespaces(stale)
    return stale

"""The main job without namespaces: every rank on this host, over loopback.

Used where the emulated fabric cannot be built (not root, no iproute2, a kernel that refuses
namespaces). The ranks keep the fabric's numbering (``node<i>`` names rank groups for fault
targets), but they all share this host: ``host.name`` is the machine's, the switch is
``unknown`` and the NIC ``lo``, so only faults of the ranks' own work (compute, data,
jitter, a slow node) can be shown.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from skewtrace import semconv
from skewtrace.cluster.fabric import FabricSpec


@dataclass
class Loopback:
    spec: FabricSpec
    host: str = field(default_factory=socket.gethostname)
    master_addr: str = "127.0.0.1"
    service_host: str = "127.0.0.1"
    driver_netns: str | None = None

    @property
    def world_size(self) -> int:
        return self.spec.world_size

    @property
    def emulates_network(self) -> bool:
        return False

    def ranks_of_node(self, node: str) -> list[int]:
        if not node.startswith("node") or not node[4:].isdigit():
            return []
        i, per = int(node[4:]), self.spec.ranks_per_node
        if i >= self.spec.nodes:
            return []
        return list(range(i * per, (i + 1) * per))

    def nodes_of_switch(self, switch: str) -> list[str]:
        return []

    def host_of_rank(self, rank: int) -> str:
        return self.host

    def switch_of_rank(self, rank: int) -> str:
        return semconv.UNKNOWN

    def rank_argv(self, rank: int, argv: list[str]) -> list[str]:
        return argv

    def service_argv(self, argv: list[str]) -> list[str]:
        return argv

    def rank_env(self, rank: int) -> dict[str, str]:
        return {"MASTER_ADDR": self.master_addr}

    def set_nic_rate(self, node_name: str, mbit: float | None) -> None:
        raise ValueError("loopback has no links to shape (nic faults need the fabric)")

    def set_uplink_rate(self, leaf: str, mbit: float | None) -> None:
        raise ValueError("loopback has no links to shape (uplink faults need the fabric)")

    def describe(self) -> str:
        return f"{self.world_size} ranks on this host over loopback"

    def __enter__(self) -> Loopback:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

"""The main job (`skewtrace demo`) on the emulated leaf/spine fabric, end to end.

Real parts throughout: Linux network namespaces, veth pairs, bridges and tbf qdiscs built
with iproute2; six gloo ranks of examples/train_2d.py (pipeline x data parallel) talking TCP
between the namespaces; the real otelcol-skewtrace and `skewtrace pacer` in the operations
namespace. Needs root and iproute2: skipped without them on a developer machine, a failure
under CI (.ci/run installs iproute2; CI runs as root).

- the fabric: namespaces, host names, addresses, shaping, cross-leaf traffic, and nothing
  left after removal, after a failed build, or after a killed run;
- the main job's pipeline on the fabric: one fault scenario in ``make test`` (the fabric smoke
  run), every scenario under ``make eval``: the spans of every rank, every step analysed, the
  fault named at some point (its verdicts step by step are tested on its recorded run);
- Ctrl-C in the middle of a run removes everything;
- the report of a run is rendered by headless Chromium with the straggler's row marked;
- loopback: network faults refused there; the same job without namespaces (``make eval``).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from collector_harness import read_file_export
from live_checks import assert_flagged_at_some_point, assert_suspected_at_some_point
from record_live import MAIN_JOB_SCENARIOS, MAIN_JOB_STEPS
from skewtrace.cluster import fabric as fabric_mod
from skewtrace.cluster import netns
from skewtrace.cluster.fabric import Fabric, FabricSpec
from skewtrace.report.collect import parse_summary
from skewtrace.semconv import JOB_ID, RANK, SPAN_STEP_SUMMARY

pytestmark = [pytest.mark.slow, pytest.mark.collector, pytest.mark.netns]


def _owned(prefix: str) -> list[str]:
    return [ns for ns in netns.list_namespaces() if ns.startswith(prefix)]


def _in_node(fab: Fabric, node: str, code: str, timeout: float = 30) -> str:
    out = subprocess.run(
        fab.exec_argv(node, [sys.executable, "-c", code]),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )
    return out.stdout.strip()


def test_fabric_is_built_shaped_and_removed(namespaces: None, tmp_path: Path) -> None:
    fab = Fabric(FabricSpec(leaves=2, nodes_per_leaf=1, nic_mbit=400, uplink_mbit=300))
    with fab:
        assert sorted(_owned(fab.prefix)) == sorted(fab.namespaces())
        assert _in_node(fab, "node1", "import socket; print(socket.gethostname())") == "node1"
        # node0 (leaf0) to node1 (leaf1): across both uplinks.
        server = subprocess.Popen(
            fab.exec_argv(
                "node1",
                [sys.executable, "-c",
                 "import socket; s = socket.create_server(('0.0.0.0', 5001)); c, _ = s.accept();"
                 " n = 0\nwhile (b := c.recv(65536)): n += len(b)\nprint(n)"],
            ),
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            time.sleep(1.0)
            _in_node(
                fab,
                "node0",
                f"import socket; c = socket.create_connection(('{fab.node('node1').data_ip}', "
                "5001), timeout=10); c.sendall(b'x' * 1_000_000); c.close()",
            )
            received, _ = server.communicate(timeout=30)
        finally:
            server.kill()
        assert received.strip() == "1000000"
        shaping = netns.run(["tc", "-n", fab.fabric_ns, "qdisc", "show", "dev", "up0"])
        assert "tbf" in shaping and "300Mbit" in shaping, shaping
        fab.set_nic_rate("node0", 25)
        shaping = netns.run(
            ["tc", "-n", fab.node("node0").namespace, "qdisc", "show", "dev", "eth0"]
        )
        assert "25Mbit" in shaping, shaping
        assert fab.uplink_stats("leaf0")["bytes"] > 1_000_000
        # Every namespace's loopback at the MTU that does not stall TCP within a node.
        for ns in fab.namespaces():
            lo = netns.run(["ip", "-n", ns, "link", "show", "lo"])
            assert f"mtu {netns.LOOPBACK_MTU} " in lo and "UP" in lo, (ns, lo)
        conf = fab.write_topology_conf(tmp_path / "topology.conf").read_text()
        assert "SwitchName=leaf0 Nodes=node0" in conf
        assert "SwitchName=spine Switches=leaf[0-1]" in conf
    assert _owned(fab.prefix) == []


_COUNT_FOR = (
    "import socket, time; s = socket.create_server(('0.0.0.0', 5001)); c, _ = s.accept();"
    " c.settimeout(5); n = 0; t = None\n"
    "while (b := c.recv(65536)):\n"
    "    t = t or time.monotonic(); n += len(b)\n"
    "    if time.monotonic() - t > {seconds}: break\n"
    "print(n)"
)
_SEND_FOR = (
    "import socket, time; c = socket.create_connection(('{ip}', 5001), timeout=10);"
    " end = time.monotonic() + {seconds}\n"
    "while time.monotonic() < end: c.sendall(b'x' * 65536)\n"
    "c.close()"
)


def test_a_fairly_shared_uplink_gives_each_node_its_share(namespaces: None) -> None:
    """``uplink_sharing="fair"``: two nodes of a leaf sending across its uplink at once get
    shares within 0.6x of each other, and a node alone gets most of the rate (htb borrows)."""
    spec = FabricSpec(
        leaves=2, nodes_per_leaf=2, nic_mbit=400, uplink_mbit=40, uplink_sharing="fair"
    )
    with Fabric(spec) as fab:
        classes = netns.run(["tc", "-n", fab.fabric_ns, "class", "show", "dev", "up0"])
        # A class for each of the 4 nodes and one for any other sender, under the uplink's.
        assert classes.count("rate 8Mbit ceil 40Mbit") == 5, classes

        def received(senders: list[tuple[str, str]], seconds: float) -> list[int]:
            servers = [
                subprocess.Popen(
                    fab.exec_argv(dst, [sys.executable, "-c", _COUNT_FOR.format(seconds=seconds)]),
                    stdout=subprocess.PIPE,
                    text=True,
                )
                for _, dst in senders
            ]
            clients = []
            try:
                time.sleep(1.0)
                for src, dst in senders:
                    code = _SEND_FOR.format(ip=fab.node(dst).data_ip, seconds=seconds + 1)
                    clients.append(
                        subprocess.Popen(fab.exec_argv(src, [sys.executable, "-c", code]))
                    )
                return [int(s.communicate(timeout=30)[0]) for s in servers]
            finally:
                for proc in [*servers, *clients]:
                    proc.kill()
                    proc.wait()

        alone = received([("node0", "node2")], 2.0)[0]
        # 40 Mbit/s is 5 MB/s: alone, most of 10 MB in 2 s.
        assert alone > 6_000_000, alone
        both = received([("node0", "node2"), ("node1", "node3")], 2.0)
        assert sum(both) < alone * 1.3, (alone, both)  # the uplink, not the NICs, binds
        assert min(both) > 0.6 * max(both), both


def test_a_failed_build_leaves_nothing(namespaces: None, monkeypatch: pytest.MonkeyPatch) -> None:
    real_run = netns.run
    calls = {"n": 0}

    def failing(args: Any, **kwargs: Any) -> str:
        if "addr" in args:
            calls["n"] += 1
            if calls["n"] == 3:
                raise netns.NetnsError("injected failure")
        return real_run(args, **kwargs)

    monkeypatch.setattr(netns, "run", failing)
    fab = Fabric(FabricSpec(leaves=2, nodes_per_leaf=2))
    with pytest.raises(netns.NetnsError, match="injected"):
        fab.create()
    monkeypatch.setattr(netns, "run", real_run)
    assert _owned(fab.prefix) == []


def test_what_a_killed_run_left_is_removed(namespaces: None) -> None:
    """A run killed with SIGKILL leaves its namespaces and a process in one of them; the
    next run's remove_stale() kills the process and deletes the namespaces."""
    code = (
        "import subprocess, sys, time\n"
        "from skewtrace.cluster.fabric import Fabric, FabricSpec\n"
        "f = Fabric(FabricSpec(leaves=1, nodes_per_leaf=2)).create()\n"
        "subprocess.Popen(f.exec_argv('node0', ['sleep', '300']))\n"
        "print(f.prefix, flush=True)\n"
        "time.sleep(300)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    prefix = proc.stdout.readline().strip()
    assert prefix.startswith(f"skt-{proc.pid}-")
    proc.kill()
    proc.wait()
    left = _owned(prefix)
    assert len(left) == 4  # fab, ops, node0, node1
    deadline = time.monotonic() + 10
    while not netns.pids_in(f"{prefix}node0") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert netns.pids_in(f"{prefix}node0"), "the sleep should still run in node0"
    removed = fabric_mod.remove_stale()
    assert set(left) <= set(removed)
    assert _owned(prefix) == []


# ------------------------------------------------------------------------- the main job


def _demo(
    otelcol: Path, workdir: Path, *args: str, timeout: float = 400
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "skewtrace.cli", "demo", "--otelcol", str(otelcol),
         "--workdir", str(workdir), "--quiet", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )  # fmt: skip


def _summary(workdir: Path) -> dict[str, Any]:
    return json.loads((workdir / "summary.json").read_text())


def _job_spans(workdir: Path, run: dict[str, Any]) -> list[Any]:
    job = run["job_id"]
    return [s for s in read_file_export(workdir / "spans.jsonl") if s.resource.get(JOB_ID) == job]


# The scenarios are the recorded ones (tests/record_live.py: a 26-step run, faults from step
# 8, hetero the whole run; what each injects), with the verdict each phase of the run's own
# summary expects. The NIC fault runs in `make test` (the fabric smoke run); the rest under
# `make eval`. Every scenario's verdict, step by step, is tested on its recorded run
# (tests/test_recorded_verdicts.py, main_job/).
EXPECTED_PHASES = {
    "nic:node2:200@8": ["rank 2 (network), nic:node2/eth0"],
    "uplink:leaf0:200@8": ["uplink:leaf0"],
    "compute:4:0.05@8": ["rank 4 (compute)"],
    "data:1:0.05@8": ["rank 1 (data)"],
    "rack:leaf1:0.05@8": ["rank 2 (compute), rank 3 (compute), switch:leaf1"],
    "compute:3:0.05@8:16": ["rank 3 (compute)"],
    "hetero:node5:12": ["rank 5 (compute)"],
}
assert set(EXPECTED_PHASES) == set(MAIN_JOB_SCENARIOS)


def _named(scenario: str) -> tuple[int, str] | str:
    """What the live run must name at some point: the first injected rank with its cause, or
    (a link alone) the injected link."""
    injected = MAIN_JOB_SCENARIOS[scenario]
    if injected.get("flags"):
        rank, cause = next(iter(injected["flags"].items()))
        return int(rank), cause
    return str(injected["suspects"][0])


@pytest.mark.parametrize(
    "scenario",
    [
        pytest.param(s, marks=() if s == "nic:node2:200@8" else pytest.mark.eval)
        for s in MAIN_JOB_SCENARIOS
    ],
)
def test_each_scenario_is_diagnosed(
    namespaces: None,
    otelcol_path: Path,
    tmp_path: Path,
    scenario: str,
) -> None:
    """The pipeline flows on the fabric: the run's summary has its phases, every rank of the
    six sent its spans, every step was analysed with the whole world, and the fault was named
    at some point after its onset (its rank with its cause, or its link suspected). How soon,
    and that nothing else was flagged, is measured by ``make eval``
    (benchmarks/scenarios.py) and decided exactly on the recorded runs."""
    result = _demo(otelcol_path, tmp_path, "--scenario", scenario, "--pacing", "off",
                   "--steps", str(MAIN_JOB_STEPS))  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (run,) = _summary(tmp_path)["runs"]
    phases = [p for p in run["phases"] if p["expected"] != "nothing flagged"]
    assert [p["expected"] for p in phases] == EXPECTED_PHASES[scenario]
    spans = _job_spans(tmp_path, run)
    assert {int(s.resource[RANK]) for s in spans if RANK in s.resource} == set(range(6))
    summaries = [parse_summary(s) for s in spans if s.name == SPAN_STEP_SUMMARY]
    assert sorted(s.step for s in summaries if s is not None) == list(range(MAIN_JOB_STEPS))
    assert {s.ranks for s in summaries if s is not None} == {6}
    onset = min(p["onset_step"] for p in phases)
    named = _named(scenario)
    if isinstance(named, str):
        assert_suspected_at_some_point(spans, named, onset)
    else:
        assert_flagged_at_some_point(spans, *named, from_step=onset)


def _interruptible() -> None:
    """In the child: SIGINT as at a terminal. A suite started in the background by a
    non-interactive shell inherits SIGINT ignored, and Python keeps an inherited SIG_IGN
    (then the demo never sees the Ctrl-C this test sends)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_removes_everything(namespaces: None, otelcol_path: Path, tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "skewtrace.cli", "demo", "--otelcol", str(otelcol_path),
         "--workdir", str(tmp_path), "--quiet", "--steps", "400", "--pacing", "off"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_interruptible,
    )  # fmt: skip
    prefix = f"skt-{proc.pid}-"
    deadline = time.monotonic() + 180
    progress = list(tmp_path.glob("*/progress.jsonl"))
    while time.monotonic() < deadline and not (progress and progress[0].stat().st_size > 0):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.5)
        progress = list(tmp_path.glob("*/progress.jsonl"))
    assert progress, "the ranks never started"
    assert _owned(prefix), "the fabric should exist while the job runs"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err
    assert _owned(prefix) == []
    left = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(tmp_path).encode() in cmdline.read_bytes():
                left.append(cmdline.parent.name)
        except OSError:
            continue
    assert left == [], f"processes left running: {left}"


def test_loopback_refuses_network_faults(otelcol_path: Path, tmp_path: Path) -> None:
    refused = _demo(otelcol_path, tmp_path / "refused", "--fabric", "loopback",
                    "--scenario", "nic:node2:100@5")  # fmt: skip
    assert refused.returncode == 2
    assert "needs the emulated network fabric" in refused.stderr


@pytest.mark.eval  # a second live job of the main job, 40 s: make test runs one on the fabric
def test_loopback_runs_the_job(otelcol_path: Path, tmp_path: Path) -> None:
    result = _demo(otelcol_path, tmp_path / "run", "--fabric", "loopback", "--pacing", "off",
                   "--scenario", "compute:2:0.05@6", "--steps", "24")  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (run,) = _summary(tmp_path / "run")["runs"]
    (phase,) = [p for p in run["phases"] if p["expected"] != "nothing flagged"]
    assert phase["expected"] == "rank 2 (compute)"
    assert_flagged_at_some_point(_job_spans(tmp_path / "run", run), 2, "compute")
    assert "over loopback" in result.stdout

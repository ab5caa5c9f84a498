"""Free ports for the processes skewtrace and its tests start (skewtrace._ports), and the
collector harness starting again on new ports when one it chose was taken first (a CI run
failed on exactly that: the Prometheus exporter's port, read free, was bound by another
process before the collector bound it)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from collector_harness import OTELCOL_YAML, CollectorError, CollectorPorts, CollectorProcess
from skewtrace import _ports


def test_ports_are_free_outside_the_ephemeral_range_and_never_repeated() -> None:
    low = _ports._ephemeral_low()
    ports = [_ports.free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(_ports._LOWEST <= port < low for port in ports), (low, ports)
    for port in ports[:5]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_without_room_below_the_ephemeral_range_the_kernel_chooses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_ports, "_ephemeral_low", lambda: _ports._LOWEST + 10)
    port = _ports.free_port()
    assert port > 0
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_an_unreadable_range_falls_back_to_linux_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_ports, "_EPHEMERAL_RANGE", tmp_path / "missing")
    assert _ports._ephemeral_low() == _ports._DEFAULT_EPHEMERAL_LOW
    (tmp_path / "range").write_text("garbage\n")
    monkeypatch.setattr(_ports, "_EPHEMERAL_RANGE", tmp_path / "range")
    assert _ports._ephemeral_low() == _ports._DEFAULT_EPHEMERAL_LOW


@pytest.mark.collector
def test_collector_starts_again_on_new_ports_when_its_port_was_taken(
    otelcol_path: Path, tmp_path: Path
) -> None:
    squatter = socket.create_server(("127.0.0.1", 0))
    try:
        taken = squatter.getsockname()[1]
        collector = CollectorProcess(otelcol_path, [OTELCOL_YAML], tmp_path)
        collector.ports.prometheus = taken
        collector.env = collector._compose_env()
        with collector:
            assert collector.ports.prometheus != taken
            collector.scrape_prometheus()  # raises unless its exporter answers on the new port
            assert collector.running()
        assert collector.log_text().count("Starting otelcol-skewtrace") == 1  # the second try
    finally:
        squatter.close()


@pytest.mark.collector
def test_ports_a_test_gave_are_never_changed(otelcol_path: Path, tmp_path: Path) -> None:
    squatter = socket.create_server(("127.0.0.1", 0))
    try:
        ports = CollectorPorts(prometheus=squatter.getsockname()[1])
        collector = CollectorProcess(otelcol_path, [OTELCOL_YAML], tmp_path, ports=ports)
        with pytest.raises(CollectorError, match="address already in use"):
            collector.start()
        assert collector.ports is ports
    finally:
        squatter.close()

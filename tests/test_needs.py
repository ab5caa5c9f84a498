"""The suite's one rule for a missing need (fail under CI, skip on a developer machine) and
its marker check, which stops collection when a test requests a fixture without its marker."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

import needs


@dataclass
class FakeItem:
    nodeid: str
    fixturenames: tuple[str, ...]
    markers: tuple[str, ...] = field(default=())

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.markers else None


def test_a_missing_need_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="prometheus is not installed"):
        needs.unavailable("prometheus is not installed")
    with pytest.raises(pytest.fail.Exception):
        needs.require("no loop devices")
    needs.require(None)  # met: nothing happens


def test_a_missing_need_skips_on_a_developer_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="prometheus is not installed"):
        needs.unavailable("prometheus is not installed")


def test_a_test_that_needs_a_marker_it_lacks_is_listed() -> None:
    items = [
        FakeItem("t.py::marked", ("otelcol_path", "tmp_path"), ("collector",)),
        FakeItem("t.py::bare", ("prometheus_binary",)),
        FakeItem("t.py::fabric", ("namespaces", "otelcol_path"), ("collector",)),
        FakeItem("t.py::unit", ("tmp_path",)),
    ]
    assert needs.unmarked(items) == [  # type: ignore[arg-type]
        "t.py::bare: prometheus (it uses prometheus_binary)",
        "t.py::fabric: netns (it uses namespaces)",
    ]


def test_every_collected_test_carries_the_markers_of_what_it_needs(
    request: pytest.FixtureRequest,
) -> None:
    """The check ran on this session's collection (conftest raises a UsageError otherwise),
    and every marker it enforces is registered in pyproject.toml."""
    assert needs.unmarked(request.session.items) == []
    registered = {line.split(":")[0] for line in request.config.getini("markers")}
    assert set(needs.FIXTURE_MARKERS.values()) <= registered

"""What a test needs from the machine, and the one rule for when it is missing.

Under CI (``CI`` set: ``.ci/run`` installs and builds everything a test needs) a missing need
fails the test, since a suite that skips what it should run passes without checking anything.
On a developer machine it skips instead, saying what to install.

Three needs have a marker, so that ``-m "not netns"`` (or ``prometheus``, ``collector``)
deselects exactly the tests that need them. A test reaches them only through conftest's
fixtures (``otelcol_path``, ``prometheus_binary``, ``promtool_binary``, ``namespaces``), and
conftest refuses, at collection, a test that requests one without its marker.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

FIXTURE_MARKERS = {
    "otelcol_path": "collector",
    "prometheus_binary": "prometheus",
    "promtool_binary": "prometheus",
    "namespaces": "netns",
}
"""Which marker a test needs when it requests each fixture."""


def under_ci() -> bool:
    return bool(os.environ.get("CI"))


def unavailable(message: str) -> NoReturn:
    """The need is missing: fail under CI, skip on a developer machine."""
    if under_ci():
        pytest.fail(f"{message} (CI must provide it)")
    pytest.skip(message)


def require(missing: str | None) -> None:
    """``missing`` says what is missing, or is None when the need is met."""
    if missing is not None:
        unavailable(missing)


def unmarked(items: list[pytest.Item]) -> list[str]:
    """``<test id>: <marker>`` of every test that requests a fixture without its marker."""
    found = []
    for item in items:
        names = getattr(item, "fixturenames", ())
        for fixture, marker in FIXTURE_MARKERS.items():
            if fixture in names and item.get_closest_marker(marker) is None:
                found.append(f"{item.nodeid}: {marker} (it uses {fixture})")
    return found

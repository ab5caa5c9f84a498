"""OpenTelemetry instruments made from the name registry: a metric's kind, unit and
description come from :data:`skewtrace.semconv.METRICS`, never from the call site, so that a
unit changed in ``src/semconv/registry.yaml`` changes every instrument (and its Prometheus
name) at once."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from skewtrace import semconv


def observable(meter: Any, name: str, callbacks: Sequence[Callable[..., Any]]) -> Any:
    """The registry's observable instrument ``name`` (a counter or a gauge), read by
    ``callbacks``."""
    spec = semconv.METRICS[name]
    creators = {
        "counter": meter.create_observable_counter,
        "gauge": meter.create_observable_gauge,
    }
    if spec.instrument not in creators:
        raise ValueError(f"{name} is a {spec.instrument} in the registry, not observable")
    return creators[spec.instrument](
        name, callbacks=list(callbacks), unit=spec.unit, description=spec.description
    )


def counter(meter: Any, name: str) -> Any:
    """The registry's counter ``name``, added to by its caller."""
    spec = semconv.METRICS[name]
    if spec.instrument != "counter":
        raise ValueError(f"{name} is a {spec.instrument} in the registry, not a counter")
    return meter.create_counter(name, unit=spec.unit, description=spec.description)

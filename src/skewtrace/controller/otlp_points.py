"""Reading OTLP metric points as the pacer keeps them: attribute values as text, a rank from
its attribute, how many points a metric carries, and the two aggregation temporalities.

Attribute values of other types (arrays, maps, bytes) are left out. What is left is client
text: the modules that keep any of it bound its length
(:data:`~skewtrace.controller._limits.MAX_VALUE_LENGTH`).
"""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2

AGGREGATION_TEMPORALITY_DELTA = metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
AGGREGATION_TEMPORALITY_CUMULATIVE = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE


def attributes(pairs: Iterable[KeyValue]) -> dict[str, str]:
    """The attributes with a string, integer, double or bool value, each as text."""
    out: dict[str, str] = {}
    for pair in pairs:
        text = _any_value_text(pair.value)
        if text is not None:
            out[pair.key] = text
    return out


def _any_value_text(value: AnyValue) -> str | None:
    which = value.WhichOneof("value")
    if which == "string_value":
        return value.string_value
    if which == "int_value":
        return str(value.int_value)
    if which == "double_value":
        return repr(value.double_value)
    if which == "bool_value":
        return "true" if value.bool_value else "false"
    return None


def parse_rank(raw: str | None) -> int | None:
    """A rank from its attribute's text: an integer of at least 0, also written with a zero
    fraction (``"3.0"``, a double attribute's text); None for anything else."""
    if raw is None:
        return None
    try:
        value = float(raw) if "." in raw else int(raw)
    except ValueError:
        return None
    if isinstance(value, float):
        if not value.is_integer():
            return None
        value = int(value)
    return value if value >= 0 else None


def point_count(metric: metrics_pb2.Metric, data_field: str | None) -> int:
    """The data points of ``metric`` (at least 1), to count them when the whole metric is
    dropped or not read."""
    if data_field is None:
        return 1
    return max(1, len(getattr(metric, data_field).data_points))

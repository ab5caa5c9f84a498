"""OTel metric and attribute names as the Collector's Prometheus exporter writes them.

The one place for this mapping: ``tools/semconvgen`` uses it to generate the ``PROM_*``
constants of ``skewtrace.semconv`` and the Prometheus column of
``docs/semantic-conventions.md``; code that reads Prometheus uses the constants, or these
functions for a name that is not registered. Standard library only (the generator loads this
file by path).
"""

from __future__ import annotations

import re

# The exporter's unit suffixes for the units skewtrace uses; `{...}` annotations add none.
_UNIT_WORDS = {
    "s": "seconds",
    "ms": "milliseconds",
    "By": "bytes",
    "Hz": "hertz",
    "W": "watts",
    "Cel": "celsius",
}
# The denominators of "X/Y" units: the exporter writes `By/s` as `bytes_per_second`.
_PER_UNIT_WORDS = {"s": "second", "m": "minute", "h": "hour", "d": "day"}
_INVALID = re.compile(r"[^a-zA-Z0-9_:]")
_ANNOTATION = re.compile(r"\{[^}]*\}")

HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")
"""Suffixes of the series a Prometheus histogram is made of."""


def prometheus_name(otel_name: str, instrument: str, unit: str) -> str:
    """The exporter's name for a metric: dots to underscores, then the unit (``_seconds``;
    ``_ratio`` for a gauge of unit ``1``), then ``_total`` for a counter.

    ``instrument`` is ``histogram``, ``gauge``, ``counter`` or ``updowncounter``.
    """
    name = _INVALID.sub("_", otel_name)
    unit = _ANNOTATION.sub("", unit)
    word = "ratio" if unit == "1" and instrument == "gauge" else _UNIT_WORDS.get(unit, "")
    if "/" in unit:
        numerator, denominator = unit.split("/", 1)
        per = _PER_UNIT_WORDS.get(denominator, "")
        word = f"{_UNIT_WORDS.get(numerator, numerator)}_per_{per}" if per else ""
    if word and not name.endswith("_" + word):
        name += "_" + word
    if instrument == "counter":
        name += "_total"
    return name


def prometheus_label(key: str) -> str:
    """The exporter's label for a data point attribute: ``training.rank`` -> ``training_rank``."""
    return _INVALID.sub("_", key).replace(":", "_")

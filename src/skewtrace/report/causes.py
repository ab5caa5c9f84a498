"""What each ``training.straggler.cause`` means, in words a person acts on (the report, the
live view). The values are the registry's (``src/semconv/registry.yaml``)."""

from __future__ import annotations

from skewtrace import semconv

_MEANING = {
    semconv.CAUSE_DATA: "its data loading (dataloader.fetch) took longer than its peers'",
    semconv.CAUSE_COMPUTE: "its forward, backward or optimizer step took longer than its peers'",
    semconv.CAUSE_HOST_WORK: (
        "its own host-side work outside every traced phase took longer than its peers' "
        "(Python preprocessing, logging, a callback, a synchronous checkpoint, garbage "
        "collection)"
    ),
    semconv.CAUSE_NETWORK: "its own link (its host's NIC, or its host) made its transfers slow",
    semconv.CAUSE_UNKNOWN: "no traced phase explains its excess time, or it never arrived",
    semconv.CAUSE_STAGE_IMBALANCE: "a pipeline stage does more work than the others",
    semconv.CAUSE_DATA_IMBALANCE: "the replicas' batches hold unequal work, step to step",
}


def meaning(cause: str, before: str = "") -> str:
    """One clause saying what ``cause`` means; for ``host_work`` with where the time sat
    (``before``: the span it preceded)."""
    text = _MEANING.get(cause, cause)
    if cause == semconv.CAUSE_HOST_WORK and before:
        text += f", before its {before}"
    return text

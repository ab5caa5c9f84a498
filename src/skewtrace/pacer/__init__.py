"""Pacing: a controller that delays ranks which persistently arrive early at the barrier.

- :mod:`skewtrace.pacer.policy`: the pure policy (window of observations in, delays out).
- :mod:`skewtrace.pacer.state`: per-job windows from OTLP histograms (cumulative or delta).
- :mod:`skewtrace.pacer.otlp_receiver` / :mod:`skewtrace.pacer.http_api`: the two servers.
- :mod:`skewtrace.pacer.service`: the wiring behind ``skewtrace pacer``.
- :mod:`skewtrace.pacer.client`: the rank side (:class:`PacingClient`, :func:`apply_delay`).

Only the client is imported here: the training process needs nothing of grpc or the server.
See ``docs/pacing.md``.
"""

from __future__ import annotations

from skewtrace.pacer.client import PacingClient, apply_delay

__all__ = ["PacingClient", "apply_delay"]

"""The rank side of the controller: what the training process imports to be paced.

- :class:`PacingClient`: polls ``GET /v1/pacing?job=ID`` in the background and hands the step
  its delay (and, with ``--policy rebalance``, the shares of the global batch).
- :func:`apply_delay`: applies a delay before the step (a sleep on CPU, a spin kernel on the
  current CUDA stream).

The controller itself (``skewtrace pacer``: the service, its servers, the window and the
policies) is :mod:`skewtrace.controller`. Only the client is imported here, and the client
imports only the decision body (:mod:`skewtrace.controller.decision`): the training process
needs nothing of grpc or the servers. See ``docs/pacing.md``.
"""

from __future__ import annotations

from skewtrace.pacer.client import PacingClient, apply_delay

__all__ = ["PacingClient", "apply_delay"]

"""The decisions over HTTP: ``GET /v1/pacing?job=ID``, ``GET /v1/jobs``, ``GET /healthz``.

``/v1/pacing`` answers ``{"job", "version", "active", "delays": {"<rank>": seconds}}`` plus
informational fields (``spread``, ``reason``). A job the pacer has not heard of (yet, or any
more) is answered ``200`` with ``{"job": ID, "version": 0, "active": false, "delays": {}}``
rather than 404: ranks usually start polling before their first metrics reach the pacer, and
"no decision" means "no delay" either way, so an inactive answer keeps their logs clean.

With a token configured every path but ``/healthz`` needs ``Authorization: Bearer <token>``
(401 otherwise); ``/healthz`` stays open for liveness probes and reveals no job data.
Standard library only (``ThreadingHTTPServer``): a rank poll is one small GET per second.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
from collections.abc import Callable, Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

_log = logging.getLogger(__name__)

PACING_PATH = "/v1/pacing"
JOBS_PATH = "/v1/jobs"
HEALTH_PATH = "/healthz"
MAX_JOB_ID_LENGTH = 256

DecisionLookup = Callable[[str], Mapping[str, Any] | None]
"""Job id -> the decision's JSON body, or None when the job is unknown."""


def inactive_answer(job_id: str) -> dict[str, Any]:
    return {"job": job_id, "version": 0, "active": False, "delays": {}}


class PacingHttpServer:
    """Serves decisions from ``lookup``; runs in a daemon thread after :meth:`start`."""

    def __init__(
        self,
        host: str,
        port: int,
        lookup: DecisionLookup,
        *,
        jobs: Callable[[], list[str]],
        health: Callable[[], Mapping[str, Any]],
        token: str | None = None,
    ) -> None:
        handler = _handler_class(lookup, jobs, health, token)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self.host = host
        self.port = int(self._server.server_address[1])
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.5},
            name="pacer-http",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


def _handler_class(
    lookup: DecisionLookup,
    jobs: Callable[[], list[str]],
    health: Callable[[], Mapping[str, Any]],
    token: str | None,
) -> type[BaseHTTPRequestHandler]:
    expected = f"Bearer {token}".encode() if token else None

    class Handler(BaseHTTPRequestHandler):
        server_version = "skewtrace-pacer"
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            _log.debug("%s " + format, self.address_string(), *args)

        def do_GET(self) -> None:
            try:
                self._route()
            except Exception:
                _log.exception("pacer HTTP handler failed")
                self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": "internal error"})

        def _route(self) -> None:
            url = urlsplit(self.path)
            if url.path == HEALTH_PATH:
                self._send(HTTPStatus.OK, {"status": "ok", **health()})
                return
            if url.path not in (PACING_PATH, JOBS_PATH):
                self._send(HTTPStatus.NOT_FOUND, {"error": f"no such path {url.path!r}"})
                return
            if not self._authorized():
                self._send(
                    HTTPStatus.UNAUTHORIZED,
                    {"error": "missing or wrong bearer token"},
                    extra_headers={"WWW-Authenticate": 'Bearer realm="skewtrace-pacer"'},
                )
                return
            if url.path == JOBS_PATH:
                self._send(HTTPStatus.OK, {"jobs": sorted(jobs())})
                return
            values = parse_qs(url.query).get("job", [])
            if len(values) != 1 or not values[0] or len(values[0]) > MAX_JOB_ID_LENGTH:
                self._send(
                    HTTPStatus.BAD_REQUEST,
                    {"error": "expected exactly one non-empty query parameter job=<id>"},
                )
                return
            job_id = values[0]
            self._send(HTTPStatus.OK, dict(lookup(job_id) or inactive_answer(job_id)))

        def _authorized(self) -> bool:
            if expected is None:
                return True
            given = self.headers.get("Authorization", "").encode()
            return hmac.compare_digest(given, expected)

        def _send(
            self,
            status: HTTPStatus,
            body: Mapping[str, Any],
            extra_headers: Mapping[str, str] | None = None,
        ) -> None:
            payload = json.dumps(body, separators=(",", ":")).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.send_header("Cache-Control", "no-store")
            for key, value in (extra_headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(payload)

    return Handler

"""The decisions over HTTP: ``GET /v1/pacing?job=ID``, ``GET /v1/jobs``, ``GET /healthz``.

``/v1/pacing`` answers a :class:`~skewtrace.decision.DecisionBody`:
``{"job", "version", "active", "delays": {"<rank>": seconds}}`` plus informational fields
(``spread``, ``reason``, ..., ``body_version``). A job the pacer has not heard of (yet, or any
more) is answered ``200`` with ``{"job": ID, "version": 0, "active": false, "delays": {},
"body_version": 1}`` rather than 404: ranks usually start polling before their first metrics
reach the pacer, and "no decision" means "no delay" either way, so an inactive answer keeps
their logs clean.

With a token configured every path but ``/healthz`` needs ``Authorization: Bearer <token>``
(the scheme in any case; 401 otherwise); ``/healthz`` stays open for liveness probes and
reveals no job data. Standard library only (``ThreadingHTTPServer``): a rank poll is one small
GET per second.

Bounded against slow and abusive clients: at most ``max_connections`` connections are served
at once (one thread each; more are answered 503 and closed at once), and a connection that has
not sent a whole request within ``read_timeout_s`` of opening (or of its previous answer) is
closed, however slowly it drips bytes. A client that goes away mid-request costs one short,
rate-limited log line, never a traceback. What was refused is counted by reason
(:attr:`PacingHttpServer.refused`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from skewtrace.controller._auth import BearerToken
from skewtrace.controller._limits import MAX_VALUE_LENGTH, LogBudget, ReasonCounts
from skewtrace.decision import STEP_AGE_PARAM, DecisionBody

_log = logging.getLogger(__name__)

PACING_PATH = "/v1/pacing"
JOBS_PATH = "/v1/jobs"
HEALTH_PATH = "/healthz"
MAX_JOB_ID_LENGTH = MAX_VALUE_LENGTH

REFUSED_UNAUTHENTICATED = "unauthenticated"
REFUSED_BAD_REQUEST = "bad_request"
REFUSED_TOO_MANY_CONNECTIONS = "too_many_connections"
REFUSED_TIMEOUT = "timeout"
REFUSED_ABORTED = "aborted"
REFUSED_REASONS = (
    REFUSED_UNAUTHENTICATED,
    REFUSED_BAD_REQUEST,
    REFUSED_TOO_MANY_CONNECTIONS,
    REFUSED_TIMEOUT,
    REFUSED_ABORTED,
)

_BUSY_BODY = b'{"error":"too many connections"}'
_BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY)
)
_LOGGED_ARG_CHARS = 200

DecisionLookup = Callable[[str], Mapping[str, Any] | None]
"""Job id -> the decision's JSON body, or None when the job is unknown."""

StepStartSink = Callable[[str, str], object]
"""(job id, the ``step_age`` query parameter as sent): a rank's report of how many seconds
before its poll one of its steps started; the sink validates and counts it."""


def inactive_answer(job_id: str) -> dict[str, Any]:
    """The answer for a job without a decision: version 0, inactive, no delays."""
    return DecisionBody(job_id).to_json()


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
        read_timeout_s: float = 10.0,
        max_connections: int = 256,
        log_budget: LogBudget | None = None,
        step_start: StepStartSink | None = None,
    ) -> None:
        self.refused = ReasonCounts(*REFUSED_REASONS)
        handler = _handler_class(
            lookup,
            jobs,
            health,
            BearerToken(token) if token else None,
            read_timeout_s,
            step_start,
        )
        self._server = _BoundedServer(
            (host, port),
            handler,
            read_timeout_s=read_timeout_s,
            max_connections=max_connections,
            refused=self.refused,
            log_budget=log_budget or LogBudget(),
        )
        self.host = host
        self.port = int(self._server.server_address[1])
        self._thread: threading.Thread | None = None

    @property
    def connections(self) -> int:
        """Connections being served now."""
        return self._server.open_connections()

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.25},  # also how often overdue connections are closed
            name="pacer-http",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.close_all()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


class _BoundedServer(ThreadingHTTPServer):
    """A thread per connection, at most ``max_connections`` of them, each with a deadline."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        *,
        read_timeout_s: float,
        max_connections: int,
        refused: ReasonCounts,
        log_budget: LogBudget,
    ) -> None:
        self.read_timeout_s = read_timeout_s
        self.max_connections = max_connections
        self.refused = refused
        self.log_budget = log_budget
        self._slots = threading.BoundedSemaphore(max_connections)
        self._lock = threading.Lock()
        self._deadlines: dict[socket.socket, float] = {}
        self._timed_out: set[socket.socket] = set()
        super().__init__(address, handler)

    # -------------------------------------------------------------- admission

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.refused.add(REFUSED_TOO_MANY_CONNECTIONS)
            self.log_budget.log(
                _log,
                logging.WARNING,
                "pacer HTTP: %d connections open (--http-max-connections); refusing more",
                self.max_connections,
                burst=1,
            )
            try:
                request.setblocking(False)
                request.send(_BUSY_RESPONSE)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        with self._lock:
            self._deadlines[request] = time.monotonic() + self.read_timeout_s
        try:
            super().process_request(request, client_address)  # starts the thread
        except BaseException:
            self._release(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(request)

    def _release(self, request: socket.socket) -> None:
        with self._lock:
            self._deadlines.pop(request, None)
            self._timed_out.discard(request)
        self._slots.release()

    # -------------------------------------------------------------- deadlines

    def renew(self, request: socket.socket) -> None:
        """A whole answer went out: the connection may take ``read_timeout_s`` for the next."""
        with self._lock:
            if request in self._deadlines and request not in self._timed_out:
                self._deadlines[request] = time.monotonic() + self.read_timeout_s

    def timed_out(self, request: socket.socket) -> bool:
        with self._lock:
            return request in self._timed_out

    def open_connections(self) -> int:
        with self._lock:
            return len(self._deadlines)

    def service_actions(self) -> None:
        """Called by ``serve_forever`` between polls: close connections past their deadline."""
        now = time.monotonic()
        with self._lock:
            overdue = [s for s, d in self._deadlines.items() if d <= now]
            overdue = [s for s in overdue if s not in self._timed_out]
            self._timed_out.update(overdue)
        for request in overdue:
            self.refused.add(REFUSED_TIMEOUT)
            _shut(request)  # the handler's blocked read returns; its thread ends
        if overdue:
            self.log_budget.log(
                _log,
                logging.INFO,
                "pacer HTTP: closed %d connection(s) that sent no whole request within %g s",
                len(overdue),
                self.read_timeout_s,
            )

    def close_all(self) -> None:
        with self._lock:
            requests = list(self._deadlines)
            self._timed_out.update(requests)
        for request in requests:
            _shut(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Reached only for what the handler did not expect; one line, never a traceback.
        exc = sys.exc_info()[1]
        self.log_budget.log(
            _log,
            logging.WARNING,
            "pacer HTTP: connection from %s failed: %s",
            client_address[0] if client_address else "?",
            type(exc).__name__,
        )


def _shut(request: socket.socket) -> None:
    with contextlib.suppress(OSError):
        request.shutdown(socket.SHUT_RDWR)


def _handler_class(
    lookup: DecisionLookup,
    jobs: Callable[[], list[str]],
    health: Callable[[], Mapping[str, Any]],
    token: BearerToken | None,
    read_timeout_s: float,
    step_start: StepStartSink | None = None,
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server: _BoundedServer
        server_version = "skewtrace-pacer"
        protocol_version = "HTTP/1.1"

        # A backstop per read; the server's deadline closes slow connections first.
        timeout = 2 * read_timeout_s

        def handle_one_request(self) -> None:
            try:
                super().handle_one_request()
            except OSError as exc:  # the client went away, or its deadline closed the socket
                self.close_connection = True
                if not self.server.timed_out(self.connection):
                    self.server.refused.add(REFUSED_ABORTED)
                    self.server.log_budget.log(
                        _log,
                        logging.INFO,
                        "pacer HTTP: connection from %s ended mid-request (%s)",
                        self.client_address[0],
                        type(exc).__name__,
                    )
                return
            if not self.close_connection:
                self.server.renew(self.connection)

        def parse_request(self) -> bool:
            if self.server.timed_out(self.connection):
                # Its deadline closed it mid-request: what was read is not a request.
                self.close_connection = True
                return False
            return super().parse_request()

        def log_message(self, format: str, *args: Any) -> None:
            # Arguments hold client text (the request line); cut it.
            cut = [a[:_LOGGED_ARG_CHARS] if isinstance(a, str) else a for a in args]
            _log.debug("%s " + format, self.address_string(), *cut)

        def send_error(
            self, code: int, message: str | None = None, explain: str | None = None
        ) -> None:
            # Malformed request lines and headers, methods other than GET.
            self._count(REFUSED_BAD_REQUEST)
            super().send_error(code, message, explain)

        def do_GET(self) -> None:
            try:
                self._route()
            except OSError:
                raise  # the client went away: handle_one_request counts it
            except Exception:
                self.server.log_budget.log(
                    _log, logging.ERROR, "pacer HTTP handler failed", exc_info=True
                )
                self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": "internal error"})

        def _route(self) -> None:
            url = urlsplit(self.path)
            if url.path == HEALTH_PATH:
                self._send(HTTPStatus.OK, {"status": "ok", **health()})
                return
            if url.path not in (PACING_PATH, JOBS_PATH):
                self._count(REFUSED_BAD_REQUEST)
                self._send(HTTPStatus.NOT_FOUND, {"error": "no such path"})
                return
            if token is not None and not token.accepts(self.headers.get("Authorization")):
                self._count(REFUSED_UNAUTHENTICATED)
                self._send(
                    HTTPStatus.UNAUTHORIZED,
                    {"error": "missing or wrong bearer token"},
                    extra_headers={"WWW-Authenticate": 'Bearer realm="skewtrace-pacer"'},
                )
                return
            if url.path == JOBS_PATH:
                self._send(HTTPStatus.OK, {"jobs": sorted(jobs())})
                return
            query = parse_qs(url.query)
            values = query.get("job", [])
            if len(values) != 1 or not values[0] or len(values[0]) > MAX_JOB_ID_LENGTH:
                self._count(REFUSED_BAD_REQUEST)
                self._send(
                    HTTPStatus.BAD_REQUEST,
                    {
                        "error": "expected exactly one non-empty query parameter job=<id> of "
                        f"at most {MAX_JOB_ID_LENGTH} characters"
                    },
                )
                return
            job_id = values[0]
            reported = query.get(STEP_AGE_PARAM, [])
            if step_start is not None and len(reported) == 1:
                # Optional; a bad value is counted by the sink and the poll still answered.
                step_start(job_id, reported[0][:_LOGGED_ARG_CHARS])
            self._send(HTTPStatus.OK, dict(lookup(job_id) or inactive_answer(job_id)))

        def _count(self, reason: str) -> None:
            if not self.server.timed_out(self.connection):
                self.server.refused.add(reason)

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

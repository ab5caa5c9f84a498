"""Who may talk to the pacer: the bearer token both servers check, and the OTLP side's TLS.

One token protects both inputs that change or reveal decisions: ranks send it on
``GET /v1/*`` (``Authorization: Bearer <token>``) and the Collector's OTLP exporter sends it
as the ``authorization`` gRPC metadata (``headers: {authorization: "Bearer <token>"}``), so
nobody who only reaches a port can push metrics for a job and get its ranks delayed.

The scheme is matched in any case (``bearer``, ``BEARER``): RFC 7235 makes auth schemes
case-insensitive. The token is compared as SHA-256 digests with :func:`hmac.compare_digest`,
so the time taken says nothing about how much of a guess was right, nor how long the token is.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

import grpc

_SCHEME = "bearer"


def bearer_credentials(header: str | None) -> str | None:
    """The token of an ``Authorization`` value ``Bearer <token>`` (any case), else None."""
    if not header:
        return None
    scheme, sep, rest = header.strip().partition(" ")
    if not sep or scheme.lower() != _SCHEME:
        return None
    return rest.strip(" ") or None


class BearerToken:
    """The configured token; :meth:`accepts` checks an ``Authorization`` value against it."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("a bearer token must not be empty")
        self._digest = _digest(token)

    def accepts(self, header: str | None) -> bool:
        given = bearer_credentials(header)
        # Compared even when absent, so a missing header costs what a wrong one costs.
        ok = hmac.compare_digest(_digest(given or ""), self._digest)
        return ok and given is not None

    def __repr__(self) -> str:  # never the token itself
        return "BearerToken(***)"


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).digest()


def grpc_server_credentials(
    cert_file: str, key_file: str, client_ca_file: str | None = None
) -> grpc.ServerCredentials:
    """TLS for the OTLP/gRPC server; with ``client_ca_file`` clients need a certificate it signed.

    Raises OSError naming the file that cannot be read.
    """
    key = _read(key_file, "--otlp-tls-key-file")
    cert = _read(cert_file, "--otlp-tls-cert-file")
    client_ca = _read(client_ca_file, "--otlp-tls-client-ca-file") if client_ca_file else None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def _read(path: str, flag: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise OSError(f"{flag}={path!r}: cannot read it: {exc.strerror or exc}") from None

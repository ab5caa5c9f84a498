"""OTLP ``ExportTraceServiceRequest`` wire bytes for skewtrace's own spans, written directly.

About 10x faster than the SDK's encoder for these spans (see :class:`FastSpanEncoder`); used
by the private gRPC exporter (:mod:`.exporters`). Field numbers are those of
``opentelemetry/proto/trace/v1/trace.proto`` and ``collector/trace/v1/trace_service.proto``;
``tests/test_export.py`` checks that the bytes are, byte for byte, what the SDK's encoder
serializes for the same spans.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan

from skewtrace.rank._export.materialize import SCOPE


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited protobuf field (``tag`` already encoded)."""
    return tag + _varint(len(payload)) + payload


def _any_value(value: Any) -> bytes:
    """OTLP AnyValue wire bytes for an attribute: a scalar, or a sequence of them (an
    ``ArrayValue``, field 5, of AnyValues)."""
    if isinstance(value, (tuple, list)):
        return _field(b"\x2a", b"".join(_field(b"\x0a", _any_value(v)) for v in value))
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)
    if isinstance(value, float):
        return b"\x21" + _F64.pack(value)
    return _field(b"\x0a", str(value).encode())


def _key_value(key: str, value: Any) -> bytes:
    return _field(b"\x0a", key.encode()) + _field(b"\x12", _any_value(value))


_F64 = struct.Struct("<d")
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_KV_CACHE_MAX = 4096


class FastSpanEncoder:
    """OTLP ExportTraceServiceRequest wire bytes for skewtrace's own spans.

    The SDK's generic encoder costs 40-140 us per span here (it hashes the resource as JSON
    per span and builds a protobuf object per field); with 4 ranks on 2 cores that alone
    would eat the 1% budget. Our spans are uniform (scalar attributes, status unset, no
    events or links), so they are written straight to the wire format, with the encodings
    of repeating attribute pairs (op, pg, source, ...) cached.
    """

    def __init__(self) -> None:
        self._kv: dict[tuple[str, type, Any], bytes] = {}
        self._resources: dict[int, tuple[Resource, bytes]] = {}

    def _attribute(self, key: str, value: Any) -> bytes:
        if isinstance(value, (tuple, list)):  # rare (pipeline.layers) and seldom repeated
            return _field(b"\x4a", _key_value(key, value))
        # The type is in the key so that True and 1 (equal, same hash) stay apart.
        cache_key = (key, type(value), value)
        encoded = self._kv.get(cache_key)
        if encoded is None:
            encoded = _field(b"\x4a", _key_value(key, value))  # Span.attributes = 9
            if len(self._kv) < _KV_CACHE_MAX:
                self._kv[cache_key] = encoded
        return encoded

    def _resource(self, resource: Resource) -> bytes:
        entry = self._resources.get(id(resource))
        if entry is None or entry[0] is not resource:
            body = b"".join(
                _field(b"\x0a", _key_value(k, v)) for k, v in resource.attributes.items()
            )
            entry = (resource, _field(b"\x0a", body))  # ResourceSpans.resource = 1
            self._resources[id(resource)] = entry
        return entry[1]

    def encode(self, spans: Sequence[ReadableSpan]) -> bytes:
        by_resource: dict[int, tuple[Resource, list[bytes]]] = {}
        attribute = self._attribute
        for span in spans:
            context, parent = span.context, span.parent
            if context is None:
                continue
            parts = [
                b"\x0a\x10",
                context.trace_id.to_bytes(16, "big"),
                b"\x12\x08",
                context.span_id.to_bytes(8, "big"),
            ]
            if parent is not None:
                parts += (b"\x22\x08", parent.span_id.to_bytes(8, "big"))
            parts += (
                _field(b"\x2a", span.name.encode()),
                b"\x30\x01",  # kind = SPAN_KIND_INTERNAL
                b"\x39",
                _U64.pack(span.start_time or 0),
                b"\x41",
                _U64.pack(span.end_time or 0),
            )
            for key, value in (span.attributes or {}).items():
                parts.append(attribute(key, value))
            # flags: HAS_IS_REMOTE, plus IS_REMOTE for a remote parent (as the SDK sets them)
            flags = 0x100 | (0x200 if parent is not None and parent.is_remote else 0)
            parts += (b"\x85\x01", _U32.pack(flags))
            entry = by_resource.get(id(span.resource))
            if entry is None:
                entry = by_resource[id(span.resource)] = (span.resource, [])
            entry[1].append(_field(b"\x12", b"".join(parts)))  # ScopeSpans.spans = 2
        scope = _field(
            b"\x0a",
            _field(b"\x0a", SCOPE.name.encode()) + _field(b"\x12", (SCOPE.version or "").encode()),
        )
        out = []
        for resource, encoded_spans in by_resource.values():
            scope_spans = _field(b"\x12", scope + b"".join(encoded_spans))
            schema = _field(b"\x1a", resource.schema_url.encode()) if resource.schema_url else b""
            out.append(_field(b"\x0a", self._resource(resource) + scope_spans + schema))
        return b"".join(out)

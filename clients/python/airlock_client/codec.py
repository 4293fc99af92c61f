"""Avro records as Airlock reads and writes them on Kafka.

Two framings, as in ``schemas/src/codec.rs``:

* single-object encoding (what Airlock writes and what a proposal should use): ``C3 01``, the
  8-byte CRC-64-AVRO fingerprint of the writer schema's Parsing Canonical Form, the datum;
* Confluent wire format: ``00``, a 4-byte big-endian schema id, the datum. Ids come from the
  caller (a registry client, or a fixed table); nothing here talks to a registry.

Every decode checks the size first, refuses a foreign payload, the wrong record type and
trailing bytes. Records written with an older schema version are resolved to the current one.
The schemas are the ones in ``schemas/avro/history`` of the Airlock repository, shipped with
this package (a test checks that they are byte for byte the same).
"""

from __future__ import annotations

import io
import json
import struct
from importlib import resources
from typing import Any, Dict, Mapping, Optional, Tuple

import fastavro
from fastavro.schema import fingerprint as _fingerprint
from fastavro.schema import to_parsing_canonical_form

#: The largest payload read or written, header included (the processor's default limit).
MAX_PAYLOAD_BYTES = 1 << 20

SINGLE_OBJECT_MAGIC = b"\xc3\x01"
CONFLUENT_MAGIC = b"\x00"

#: The records this package reads or writes.
RECORDS = ("ToolProposal", "Decision", "Outcome", "Control")


class CodecError(ValueError):
    """A payload that is not the expected Airlock record."""


class _Version:
    __slots__ = ("record", "version", "schema", "fingerprint", "text")

    def __init__(self, record: str, version: int, schema: Any, text: str = ""):
        self.record = record
        self.version = version
        self.schema = schema
        self.text = text
        self.fingerprint = bytes.fromhex(
            _fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO")
        )


def _load() -> Tuple[Dict[str, _Version], Dict[bytes, _Version]]:
    current: Dict[str, _Version] = {}
    by_fingerprint: Dict[bytes, _Version] = {}
    root = resources.files("airlock_client") / "schemas"
    for record in RECORDS:
        versions = []
        for entry in (root / record).iterdir():
            name = entry.name
            if name.startswith("v") and name.endswith(".avsc"):
                text = entry.read_text("utf-8")
                schema = fastavro.parse_schema(json.loads(text))
                versions.append(_Version(record, int(name[1:-5]), schema, text))
        if not versions:
            raise RuntimeError(f"no schema of {record} in the package")
        versions.sort(key=lambda v: v.version)
        current[record] = versions[-1]
        for v in versions:
            by_fingerprint[v.fingerprint] = v
    return current, by_fingerprint


_CURRENT, _BY_FINGERPRINT = _load()


def fingerprint(record: str) -> bytes:
    """The 8 header bytes of ``record``'s current schema in single-object encoding."""
    return _CURRENT[record].fingerprint


def current_version(record: str) -> int:
    """The version number of ``record``'s current schema (what this client writes and reads
    into)."""
    return _CURRENT[record].version


def schema_text(record: str) -> str:
    """The ``.avsc`` text of ``record``'s current schema, as shipped (and as ``airlock topics
    create`` registers it in a schema registry)."""
    return _CURRENT[record].text


def _datum(record: str, value: Mapping[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, _CURRENT[record].schema, dict(value))
    return out.getvalue()


def encode(record: str, value: Mapping[str, Any], schema_id: Optional[int] = None) -> bytes:
    """``value`` (a dict of the record's fields) as a payload: single-object encoding, or
    the Confluent wire format when ``schema_id`` (the registry's id of the current schema)
    is given."""
    datum = _datum(record, value)
    if schema_id is None:
        payload = SINGLE_OBJECT_MAGIC + _CURRENT[record].fingerprint + datum
    else:
        payload = CONFLUENT_MAGIC + struct.pack(">I", schema_id) + datum
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise CodecError(
            f"the {record} is {len(payload)} bytes encoded, over the {MAX_PAYLOAD_BYTES}-byte limit"
        )
    return payload


def decode(
    record: str,
    payload: bytes,
    schema_ids: Optional[Mapping[int, Tuple[str, int]]] = None,
) -> Dict[str, Any]:
    """The record in ``payload``, resolved to the current schema. ``schema_ids`` maps the
    Confluent ids this reader accepts to ``(record, version)``."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise CodecError(f"payload of {len(payload)} bytes is over the {MAX_PAYLOAD_BYTES}-byte limit")
    if payload[:2] == SINGLE_OBJECT_MAGIC:
        if len(payload) < 10:
            raise CodecError("a single-object payload shorter than its header")
        writer = _BY_FINGERPRINT.get(bytes(payload[2:10]))
        if writer is None:
            raise CodecError(
                f"unknown schema fingerprint {bytes(payload[2:10]).hex()}: written by a newer "
                "Airlock? upgrade this client"
            )
        body = payload[10:]
    elif payload[:1] == CONFLUENT_MAGIC:
        if len(payload) < 5:
            raise CodecError("a Confluent payload shorter than its header")
        (schema_id,) = struct.unpack(">I", payload[1:5])
        known = (schema_ids or {}).get(schema_id)
        if known is None:
            raise CodecError(f"unknown Confluent schema id {schema_id}")
        writer = next(
            (v for v in _BY_FINGERPRINT.values() if (v.record, v.version) == tuple(known)), None
        )
        if writer is None:
            raise CodecError(f"schema id {schema_id} names {known}, which this client lacks")
        body = payload[5:]
    else:
        raise CodecError("not an Airlock payload (neither single-object nor Confluent framing)")
    if writer.record != record:
        raise CodecError(f"a {writer.record}, not a {record}")
    stream = io.BytesIO(body)
    try:
        value = fastavro.schemaless_reader(stream, writer.schema, _CURRENT[record].schema)
    except Exception as e:  # fastavro raises several types on truncated or bad data
        raise CodecError(f"the {record} does not decode: {e}") from None
    if stream.tell() != len(body):
        raise CodecError(f"{len(body) - stream.tell()} trailing bytes after the {record}")
    return value  # type: ignore[return-value]

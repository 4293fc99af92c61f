"""Schema ids from a Confluent-compatible schema registry, for publishing in the Confluent wire
format (``00``, the 4-byte big-endian id, the Avro datum) instead of single-object encoding.

Airlock's subjects (``airlock topics create`` with ``schema_registry.url`` registers them, with
BACKWARD compatibility): ``<topic>-value`` for a topic of one record type, e.g.
``airlock.proposals-value`` for the ToolProposal schema. :meth:`SchemaRegistry.schema_id` looks
the shipped schema up under a subject (``POST /subjects/<subject>``) and caches its id; with
``register=True`` it registers the schema when the subject lacks it (the registry refuses an
incompatible one). Only the standard library talks HTTP here; every call is bounded by
``timeout``.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Dict, Optional, Tuple

from . import codec

_CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


class RegistryError(Exception):
    """The registry is unreachable, refuses a schema, or lacks the subject."""


def topic_subject(topic: str) -> str:
    """The subject of a topic that carries one record type (TopicNameStrategy)."""
    return f"{topic}-value"


class SchemaRegistry:
    """A client of a registry's Confluent API at ``url`` (e.g. ``http://registry:8081``, or
    Apicurio's ``http://registry:8080/apis/ccompat/v7``)."""

    def __init__(self, url: str, *, timeout: float = 10.0):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._ids: Dict[Tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def schema_id(self, subject: str, record: str, *, register: bool = False) -> int:
        """The registry's id of ``record``'s current schema under ``subject`` (cached after the
        first answer). With ``register``, a subject that lacks it gets it registered."""
        with self._lock:
            cached = self._ids.get((subject, record))
        if cached is not None:
            return cached
        text = codec.schema_text(record)
        path = "/subjects/" + urllib.parse.quote(subject, safe="")
        status, body = self._call("POST", path, {"schema": text})
        if status == 200:
            schema_id = self._id(body, subject)
        elif status == 404 and not register:
            raise RegistryError(
                f"schema registry {self.url}: {record}'s schema is not registered under "
                f"{subject} ({_message(body)}); run `airlock topics create` with "
                "schema_registry.url set, or pass register=True"
            )
        elif status == 404:
            status, body = self._call("POST", path + "/versions", {"schema": text})
            if status == 409:
                raise RegistryError(
                    f"schema registry {self.url}: {record}'s schema refused under {subject} "
                    f"as incompatible: {_message(body)}"
                )
            if status != 200:
                raise RegistryError(
                    f"schema registry {self.url}: registering {record} under {subject}: "
                    f"HTTP {status}: {_message(body)}"
                )
            schema_id = self._id(body, subject)
        else:
            raise RegistryError(
                f"schema registry {self.url}: looking up {record} under {subject}: "
                f"HTTP {status}: {_message(body)}"
            )
        with self._lock:
            self._ids[(subject, record)] = schema_id
        return schema_id

    def _call(self, method: str, path: str, body: Any) -> Tuple[int, Any]:
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode("utf-8"),
            method=method,
            headers={"Content-Type": _CONTENT_TYPE, "Accept": _CONTENT_TYPE},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return response.status, _json(response.read())
        except urllib.error.HTTPError as e:
            return e.code, _json(e.read())
        except (urllib.error.URLError, OSError) as e:
            raise RegistryError(
                f"schema registry unreachable: {method} {self.url}{path} "
                f"(timeout {self.timeout} s): {e}"
            ) from e

    def _id(self, body: Any, subject: str) -> int:
        schema_id = body.get("id") if isinstance(body, dict) else None
        if not isinstance(schema_id, int) or not 0 <= schema_id < 1 << 32:
            raise RegistryError(f"schema registry {self.url}: {subject}: no schema id in {body!r}")
        return schema_id


def _json(data: bytes) -> Any:
    try:
        return json.loads(data.decode("utf-8"))
    except ValueError:
        return data.decode("utf-8", "replace")


def _message(body: Any) -> str:
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return body["message"]
    return str(body)

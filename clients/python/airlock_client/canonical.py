"""Canonical tool-call arguments, their hash, and the idempotency key.

The same frozen contract as Airlock's processor (``processor/src/core/canonical.rs``): a
proposal is bound to the SHA-256 of its canonical arguments, so a client must compute that
form byte for byte as the processor does. The rules (RFC 8785 restricted to a safe subset):

* one JSON text, nothing after it;
* no duplicate object keys;
* numbers are integer literals within +-(2**53 - 1): no fractions, exponents or ``-0``
  (money is integer minor units plus a currency code);
* at most 64 levels of nesting;
* output: object keys sorted by UTF-16 code units (``sort_keys`` sorts by code points, which
  differs above U+FFFF), no whitespace, minimal string escapes, everything else as UTF-8.

The shared test vectors in ``schemas/vectors/client.json`` are checked by the Rust tests and
by this package's tests.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, List, Tuple, Union

#: Deepest nesting accepted; the top-level container is depth 1.
MAX_DEPTH = 64
#: Largest integer magnitude accepted: 2**53 - 1.
MAX_SAFE_INTEGER = (1 << 53) - 1

_IDEMPOTENCY_KEY_DOMAIN = b"airlock/idempotency-key/v1\0"
_IDEMPOTENCY_KEY_PREFIX = "alk1-"
_IDEMPOTENCY_KEY_HEX_LEN = 32


class CanonicalError(ValueError):
    """Arguments that have no canonical form. ``kind`` is one of ``syntax``,
    ``duplicate_key``, ``non_integer``, ``integer_out_of_range``, ``too_deep``; ``path`` is the
    JSON pointer of the offending place (``(root)`` for the document itself)."""

    def __init__(self, kind: str, path: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.path = path


@dataclass(frozen=True)
class Canonical:
    """A canonicalized document: its canonical text and the lowercase hex SHA-256 of it."""

    json: str
    hash: str


class _Object:
    """An object as parsed, keys in document order, duplicates kept (checked later)."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: List[Tuple[str, Any]]):
        self.pairs = pairs


class _Number:
    """A number literal outside the accepted subset, kept until its path is known."""

    __slots__ = ("kind", "literal")

    def __init__(self, kind: str, literal: str):
        self.kind = kind
        self.literal = literal


def _parse_int(literal: str) -> Union[int, _Number]:
    if literal == "-0":
        return _Number("non_integer", literal)
    value = int(literal)
    if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
        return value
    # Within 64 bits the processor's parser reads an integer and refuses its range; beyond,
    # it reads a float and refuses the kind.
    if -(1 << 63) <= value < (1 << 64):
        return _Number("integer_out_of_range", literal)
    return _Number("non_integer", literal)


def _parse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _decoder() -> json.JSONDecoder:
    return json.JSONDecoder(
        object_pairs_hook=_Object,
        parse_int=_parse_int,
        parse_float=lambda literal: _Number("non_integer", literal),
        parse_constant=_parse_constant,
        strict=True,
    )


def _pointer(path: List[Union[str, int]]) -> str:
    if not path:
        return "(root)"
    return "".join(
        "/" + (str(p) if isinstance(p, int) else p.replace("~", "~0").replace("/", "~1"))
        for p in path
    )


def _utf16_key(key: str) -> bytes:
    return key.encode("utf-16-be", "surrogatepass")


def _check_string(value: str, path: List[Union[str, int]]) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise CanonicalError(
            "syntax", _pointer(path), f"invalid JSON: a lone surrogate in a string at {_pointer(path)}"
        ) from None


def _write(node: Any, path: List[Union[str, int]], depth: int, out: List[str]) -> None:
    if node is None:
        out.append("null")
    elif node is True:
        out.append("true")
    elif node is False:
        out.append("false")
    elif isinstance(node, int):
        out.append(str(node))
    elif isinstance(node, _Number):
        where = _pointer(path)
        if node.kind == "integer_out_of_range":
            raise CanonicalError(
                node.kind,
                where,
                f"integer {node.literal} at {where} is outside +-(2^53-1) and not exactly "
                "representable everywhere",
            )
        raise CanonicalError(
            node.kind,
            where,
            f"number at {where} is not an integer literal within +-(2^53-1): fractions, "
            "exponents and -0 are not accepted (express money as integer minor units plus a "
            "currency code)",
        )
    elif isinstance(node, str):
        _check_string(node, path)
        out.append(_string(node))
    elif isinstance(node, list):
        _enter(depth, path)
        out.append("[")
        for i, item in enumerate(node):
            if i:
                out.append(",")
            path.append(i)
            _write(item, path, depth + 1, out)
            path.pop()
        out.append("]")
    elif isinstance(node, _Object):
        _enter(depth, path)
        seen = set()
        for key, _ in node.pairs:
            _check_string(key, path)
            if key in seen:
                where = _pointer(path)
                raise CanonicalError(
                    "duplicate_key", where, f"duplicate object key {key!r} in the object at {where}"
                )
            seen.add(key)
        # Values are checked in document order (the first problem is the one reported), then
        # written in canonical order.
        written = []
        for key, value in node.pairs:
            path.append(key)
            part: List[str] = []
            _write(value, path, depth + 1, part)
            path.pop()
            written.append((_utf16_key(key), key, "".join(part)))
        written.sort(key=lambda entry: entry[0])
        out.append("{")
        out.append(",".join(_string(key) + ":" + text for _, key, text in written))
        out.append("}")
    else:  # pragma: no cover - the decoder makes nothing else
        raise TypeError(f"unexpected node {type(node).__name__}")


def _enter(depth: int, path: List[Union[str, int]]) -> None:
    if depth >= MAX_DEPTH:
        where = _pointer(path)
        raise CanonicalError("too_deep", where, f"nesting deeper than {MAX_DEPTH} levels at {where}")


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _string(value: str) -> str:
    parts = ['"']
    for ch in value:
        escaped = _ESCAPES.get(ch)
        if escaped is not None:
            parts.append(escaped)
        elif ord(ch) < 0x20:
            parts.append(f"\\u{ord(ch):04x}")
        else:
            parts.append(ch)
    parts.append('"')
    return "".join(parts)


def _too_deep(text: str) -> CanonicalError:
    """The error for a text nested too deep for Python's own parser: the path of the first
    container past the limit, found by a scan of the text's structure."""
    from json.decoder import scanstring  # type: ignore[attr-defined]

    stack: List[List[Any]] = []  # per open container: its kind and the current index or key
    expect_key = False
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            try:
                value, i = scanstring(text, i + 1, True)
            except ValueError as e:
                return CanonicalError("syntax", "(root)", f"invalid JSON: {e}")
            if expect_key:
                stack[-1][1] = value
                expect_key = False
            continue
        if ch in "[{":
            if len(stack) >= MAX_DEPTH:
                where = _pointer([frame[1] for frame in stack])
                return CanonicalError(
                    "too_deep", where, f"nesting deeper than {MAX_DEPTH} levels at {where}"
                )
            stack.append([ch, 0 if ch == "[" else ""])
            expect_key = ch == "{"
        elif ch in "]}":
            if stack:
                stack.pop()
            expect_key = False
        elif ch == "," and stack:
            if stack[-1][0] == "[":
                stack[-1][1] += 1
            else:
                expect_key = True
        i += 1
    return CanonicalError("syntax", "(root)", "invalid JSON: nested too deep to parse")


def canonicalize(text: Union[str, bytes]) -> Canonical:
    """The canonical form of a JSON text and its hash; :class:`CanonicalError` when the text
    has none (the processor would refuse the proposal as MALFORMED)."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise CanonicalError("syntax", "(root)", f"invalid JSON: not UTF-8 ({e})") from None
    try:
        node = _decoder().decode(text)
    except RecursionError:
        raise _too_deep(text) from None
    except json.JSONDecodeError as e:
        raise CanonicalError("syntax", "(root)", f"invalid JSON: {e}") from None
    except ValueError as e:
        raise CanonicalError("syntax", "(root)", f"invalid JSON: {e}") from None
    out: List[str] = []
    _write(node, [], 0, out)
    canonical = "".join(out)
    return Canonical(json=canonical, hash=arguments_hash(canonical))


def canonical_json(value: Any) -> str:
    """The canonical text of a Python value (dict, list, str, int, bool, None)."""
    return canonicalize(json.dumps(value, ensure_ascii=False, allow_nan=False)).json


def arguments_hash(canonical: str) -> str:
    """Lowercase hex SHA-256 of an already canonical text's UTF-8 bytes."""
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def idempotency_key(operation_key: str) -> str:
    """The key Airlock's connectors send downstream for ``operation_key``:
    ``alk1-`` and the first 32 hex digits of SHA-256(domain || key). Never changes."""
    digest = hashlib.sha256(_IDEMPOTENCY_KEY_DOMAIN + operation_key.encode("utf-8")).hexdigest()
    return _IDEMPOTENCY_KEY_PREFIX + digest[:_IDEMPOTENCY_KEY_HEX_LEN]

"""The reader's side of Airlock's owner-epoch fence.

Each partition of an output topic (decisions, dispatch commands) is written by the processor
task that owns it; a task that claims a partition first writes a fence marker carrying its
owner epoch. A record whose owner epoch is below the highest marker read before it on the same
partition was written by an owner that had already lost the partition (a zombie) and must be
ignored. Records carry the epoch in the ``airlock-owner-epoch`` header (decimal text); markers
also carry ``airlock-kind: fence``. A reader must read a partition from its start to know its
fence.

A processor with a capability key signs each marker (header ``airlock-capability``: version
byte 1 and an Ed25519 signature of :func:`fence_message`). A reader given the processor's
verifying keys (:class:`MarkerVerifier`) raises its fence only for markers that verify, so
that whoever can write the topic cannot make every later answer unreadable with a marker of a
huge epoch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, Optional, Tuple, Union

KIND = "airlock-kind"
OWNER_EPOCH = "airlock-owner-epoch"
CAPABILITY = "airlock-capability"
FENCE_KIND = b"fence"
BARRIER_KIND = b"barrier"

ACCEPT = "accept"
MARKER = "marker"
FENCED = "fenced"
#: A fence marker whose capability does not verify: it raises no fence.
FORGED = "forged"

FENCE_DOMAIN = b"airlock/fence/v1\x00"
CAPABILITY_VERSION = 1


def fence_message(topic: str, partition: int, owner_epoch: int) -> bytes:
    """The signed message of a fence marker: the domain tag, the topic (big-endian u32 length
    and UTF-8 bytes), the partition (i32) and the owner epoch (i64), big-endian."""
    name = topic.encode("utf-8")
    return (
        FENCE_DOMAIN
        + len(name).to_bytes(4, "big")
        + name
        + partition.to_bytes(4, "big", signed=True)
        + owner_epoch.to_bytes(8, "big", signed=True)
    )


def load_verifying_key(key: Union[str, bytes, "os.PathLike[str]"]) -> bytes:
    """A verifying key as the processor's ``airlock keygen`` writes it: a file of 64 hex
    characters or 32 raw bytes (a path), or the 32 key bytes themselves."""
    if isinstance(key, (bytes, bytearray)) and len(key) == 32:
        return bytes(key)
    with open(key, "rb") as f:
        data = f.read()
    text = data.strip()
    if len(text) == 64:
        try:
            return bytes.fromhex(text.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            pass
    if len(data) == 32:
        return data
    raise ValueError(f"{key!r}: not a verifying key (64 hex characters or 32 raw bytes)")


class MarkerVerifier:
    """Checks a fence marker's capability against the processor's verifying keys (several
    during a key rotation). Needs the ``cryptography`` package."""

    def __init__(self, keys: Iterable[Union[str, bytes, "os.PathLike[str]"]]):
        try:
            from cryptography.exceptions import InvalidSignature
            from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError(
                "verifying fence markers needs the 'cryptography' package "
                "(pip install 'airlock-client[verify]')"
            ) from e
        self._invalid = InvalidSignature
        self._keys = [Ed25519PublicKey.from_public_bytes(load_verifying_key(k)) for k in keys]
        if not self._keys:
            raise ValueError("MarkerVerifier needs at least one verifying key")

    def __call__(
        self, topic: str, partition: int, owner_epoch: int, capability: Optional[bytes]
    ) -> bool:
        if not capability or len(capability) != 65 or capability[0] != CAPABILITY_VERSION:
            return False
        message = fence_message(topic, partition, owner_epoch)
        for key in self._keys:
            try:
                key.verify(bytes(capability[1:]), message)
                return True
            except self._invalid:
                continue
        return False


@dataclass(frozen=True)
class Admit:
    """What to do with one record: ``accept`` it, it is a ``marker`` (not a payload), or it is
    ``fenced`` (a zombie's write: ignore it)."""

    verdict: str
    owner_epoch: Optional[int] = None
    fence: int = 0


def _decimal_i64(value: Optional[bytes]) -> Optional[int]:
    """A header's decimal value as Airlock parses it: an optional sign and ASCII digits,
    within 64 bits; anything else is no value."""
    text = bytes(value or b"")
    digits = text[1:] if text[:1] in (b"+", b"-") else text
    if not digits or not digits.isdigit() or not digits.isascii():
        return None
    number = int(text.decode("ascii"))
    return number if -(1 << 63) <= number < (1 << 63) else None


Verify = Callable[[str, int, int, Optional[bytes]], bool]


class FenceFilter:
    """The highest fence marker read per (topic, partition). With ``verify`` (a
    :class:`MarkerVerifier`), only markers that verify raise the fence; others are
    ``forged``."""

    def __init__(self, verify: Optional[Verify] = None) -> None:
        self._fences: Dict[Tuple[str, int], int] = {}
        self._verify = verify

    def admit(
        self, topic: str, partition: int, headers: Optional[Iterable[Tuple[str, bytes]]]
    ) -> Admit:
        """Classifies one record, given its headers, in the order records are read."""
        kind = None
        epoch = None
        capability = None
        # The last header of a name counts, as for every Airlock reader.
        for key, value in headers or ():
            if key == KIND:
                kind = value
            elif key == OWNER_EPOCH:
                epoch = _decimal_i64(value)
            elif key == CAPABILITY:
                capability = value
        if epoch is None:
            # Not written by an Airlock task: nothing to fence.
            return Admit(ACCEPT)
        fence = self._fences.get((topic, partition), 0)
        if kind == FENCE_KIND and self._verify is not None:
            if not self._verify(topic, partition, epoch, capability):
                return Admit(FORGED, epoch, fence)
        if kind == FENCE_KIND:
            self._fences[(topic, partition)] = max(fence, epoch)
            return Admit(MARKER, epoch, max(fence, epoch))
        if epoch < fence:
            return Admit(FENCED, epoch, fence)
        return Admit(ACCEPT, epoch, fence)

    def fence(self, topic: str, partition: int) -> int:
        """The highest marker read on the partition (0 before any)."""
        return self._fences.get((topic, partition), 0)

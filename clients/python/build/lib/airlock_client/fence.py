"""The reader's side of Airlock's owner-epoch fence.

Each partition of an output topic (decisions, dispatch commands) is written by the processor
task that owns it; a task that claims a partition first writes a fence marker carrying its
owner epoch. A record whose owner epoch is below the highest marker read before it on the same
partition was written by an owner that had already lost the partition (a zombie) and must be
ignored. Records carry the epoch in the ``airlock-owner-epoch`` header (decimal text); markers
also carry ``airlock-kind: fence``. A reader must read a partition from its start to know its
fence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, Optional, Tuple

KIND = "airlock-kind"
OWNER_EPOCH = "airlock-owner-epoch"
FENCE_KIND = b"fence"
BARRIER_KIND = b"barrier"

ACCEPT = "accept"
MARKER = "marker"
FENCED = "fenced"


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


class FenceFilter:
    """The highest fence marker read per (topic, partition)."""

    def __init__(self) -> None:
        self._fences: Dict[Tuple[str, int], int] = {}

    def admit(
        self, topic: str, partition: int, headers: Optional[Iterable[Tuple[str, bytes]]]
    ) -> Admit:
        """Classifies one record, given its headers, in the order records are read."""
        kind = None
        epoch = None
        for key, value in headers or ():
            if key == KIND:
                kind = value
            elif key == OWNER_EPOCH:
                epoch = _decimal_i64(value)
        if epoch is None:
            # Not written by an Airlock task: nothing to fence.
            return Admit(ACCEPT)
        fence = self._fences.get((topic, partition), 0)
        if kind == FENCE_KIND:
            self._fences[(topic, partition)] = max(fence, epoch)
            return Admit(MARKER, epoch, max(fence, epoch))
        if epoch < fence:
            return Admit(FENCED, epoch, fence)
        return Admit(ACCEPT, epoch, fence)

    def fence(self, topic: str, partition: int) -> int:
        """The highest marker read on the partition (0 before any)."""
        return self._fences.get((topic, partition), 0)

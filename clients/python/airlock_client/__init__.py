"""Airlock's Python client: publish tool proposals, wait for decisions and outcomes.

See ``README.md`` beside this package for the contract it implements.
"""

from .aio import AsyncClient
from .canonical import Canonical, CanonicalError, arguments_hash, canonicalize, idempotency_key
from .client import (
    AirlockError,
    BrokerUnavailable,
    Client,
    Decision,
    Refused,
    Settlement,
    TimedOut,
    content_id,
    derive_proposal_id,
)
from .fence import FenceFilter, MarkerVerifier, fence_message
from .partitioner import murmur2, partition_for
from .registry import RegistryError, SchemaRegistry

__all__ = [
    "AirlockError",
    "AsyncClient",
    "BrokerUnavailable",
    "Canonical",
    "CanonicalError",
    "Client",
    "Decision",
    "FenceFilter",
    "MarkerVerifier",
    "Refused",
    "RegistryError",
    "SchemaRegistry",
    "Settlement",
    "TimedOut",
    "arguments_hash",
    "canonicalize",
    "content_id",
    "derive_proposal_id",
    "fence_message",
    "idempotency_key",
    "murmur2",
    "partition_for",
]

"""The schema registry helper without a registry: what it would register, and its errors."""

import time

import pytest

from airlock_client import Client, RegistryError, SchemaRegistry, codec
from airlock_client.registry import topic_subject

from conftest import REPO


def test_the_schema_looked_up_is_the_one_airlock_registers():
    # `airlock topics create` registers the .avsc text as it is; the lookup sends the same text.
    for record in codec.RECORDS:
        shipped = (REPO / "schemas" / "avro" / f"{record}.avsc").read_text("utf-8")
        assert codec.schema_text(record) == shipped, record


def test_subjects_follow_the_topic():
    assert topic_subject("airlock.proposals") == "airlock.proposals-value"


def test_an_unreachable_registry_is_named_and_bounded():
    registry = SchemaRegistry("http://127.0.0.1:9/apis/ccompat/v7", timeout=2.0)
    started = time.monotonic()
    with pytest.raises(RegistryError, match="schema registry unreachable: POST http://127.0.0.1:9"):
        registry.schema_id("airlock.proposals-value", "ToolProposal")
    assert time.monotonic() - started < 5


def test_a_fixed_id_and_a_registry_are_exclusive():
    with pytest.raises(ValueError, match="not both"):
        Client("127.0.0.1:9", partitions=1, schema_id=7, schema_registry_url="http://127.0.0.1:9")

"""The client publishing in the Confluent wire format against a running Airlock and a real
schema registry, started by the Rust test ``tests/tests/schema_registry.rs``, which passes:

* ``AIRLOCK_TEST_BROKERS``, ``AIRLOCK_TEST_PREFIX``: where Airlock's topics are;
* ``AIRLOCK_TEST_SCHEMA_REGISTRY``: the registry's Confluent API (Airlock's schemas registered
  there by ``airlock topics create``, and the processor running with it);
* ``AIRLOCK_TEST_PROPOSAL_SCHEMA_ID``: the id the registry gave the ToolProposal schema.

The Rust test then checks that the proposals on the topic are Confluent-framed.
"""

import os
import uuid

import pytest

from airlock_client import Client, RegistryError, SchemaRegistry

BROKERS = os.environ["AIRLOCK_TEST_BROKERS"]
PREFIX = os.environ["AIRLOCK_TEST_PREFIX"]
URL = os.environ["AIRLOCK_TEST_SCHEMA_REGISTRY"]
PROPOSAL_ID = int(os.environ["AIRLOCK_TEST_PROPOSAL_SCHEMA_ID"])
RUN = uuid.uuid4().hex[:8]


def refund(key, minor_units):
    return dict(
        tool="refund",
        operation_key=key,
        arguments={
            "tenant_id": "acme",
            "account_id": "acct-42",
            "amount": {"minor_units": minor_units, "currency": "EUR"},
        },
        tenant="acme",
        principal="agent-support-1",
        run_id=f"run-{RUN}",
        logical_call_id=key,
    )


def test_the_id_is_looked_up_under_the_topic_subject():
    registry = SchemaRegistry(URL)
    assert registry.schema_id(f"{PREFIX}proposals-value", "ToolProposal") == PROPOSAL_ID


def test_a_missing_subject_is_refused_unless_registering():
    registry = SchemaRegistry(URL)
    subject = f"{PREFIX}py-{RUN}-value"
    with pytest.raises(RegistryError, match="is not registered under"):
        registry.schema_id(subject, "ToolProposal")
    registered = registry.schema_id(subject, "ToolProposal", register=True)
    assert isinstance(registered, int)
    assert SchemaRegistry(URL).schema_id(subject, "ToolProposal") == registered


def test_a_proposal_in_confluent_framing_is_decided():
    with Client(BROKERS, topic_prefix=PREFIX, schema_registry_url=URL) as client:
        assert client.schema_id == PROPOSAL_ID
        first = client.propose(**refund(f"refund:py-cf-{RUN}", 1250))
        assert (first.verdict, first.reason) == ("ACCEPTED", "AUTO_APPROVED"), first
        assert not first.earlier

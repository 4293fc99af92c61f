"""A forged fence marker on the decisions topic, against a running Airlock (started by
``tests/tests/python_client.rs`` after every other client test: the marker stays in the topic
and hides that partition's later answers from readers without the processor's key).

Besides the variables the integration tests read, ``AIRLOCK_TEST_VERIFYING_KEY`` names the
processor's capability verifying key file.
"""

import os
import uuid

import pytest
from confluent_kafka import Producer

from airlock_client import Client, TimedOut, partition_for

BROKERS = os.environ["AIRLOCK_TEST_BROKERS"]
PREFIX = os.environ["AIRLOCK_TEST_PREFIX"]
KEY_FILE = os.environ["AIRLOCK_TEST_VERIFYING_KEY"]
RUN = uuid.uuid4().hex[:8]


def refund(key):
    return dict(
        tool="refund",
        operation_key=key,
        arguments={
            "tenant_id": "acme",
            "account_id": "acct-42",
            "amount": {"minor_units": 300, "currency": "EUR"},
        },
        tenant="acme",
        principal="agent-support-1",
        run_id=f"run-{RUN}",
        logical_call_id=key,
    )


def test_a_client_with_the_processors_key_reads_past_a_forged_marker():
    with Client(BROKERS, topic_prefix=PREFIX, verifying_keys=[KEY_FILE]) as verifying:
        first = f"refund:py-fence-{RUN}-1"
        answer = verifying.propose(**refund(first))
        assert answer.verdict == "ACCEPTED", answer
        # The processor's own marker verified: the partition's fence is its owner epoch.
        partition = partition_for(first.encode(), verifying.partitions)
        decisions = f"{PREFIX}decisions"
        assert verifying._reader.fence.fence(decisions, partition) >= 1

        # Anyone who can write the topic puts a marker of a huge epoch there, unsigned.
        forger = Producer({"bootstrap.servers": BROKERS})
        forger.produce(
            decisions,
            key=b"\x00airlock-fence/999999",
            value=b"999999",
            partition=partition,
            headers=[("airlock-kind", b"fence"), ("airlock-owner-epoch", b"999999")],
        )
        assert forger.flush(30) == 0

        # Another key of the same partition, proposed after it.
        second = next(
            k
            for k in (f"refund:py-fence-{RUN}-{i}" for i in range(2, 1000))
            if partition_for(k.encode(), verifying.partitions) == partition
        )
        answer = verifying.propose(**refund(second))
        assert answer.verdict == "ACCEPTED", answer
        assert verifying._reader.fence.fence(decisions, partition) < 999999

    # Without the key, the forged marker fences every later answer of the partition.
    with Client(BROKERS, topic_prefix=PREFIX) as trusting:
        third = next(
            k
            for k in (f"refund:py-fence-{RUN}-t{i}" for i in range(1000))
            if partition_for(k.encode(), trusting.partitions) == partition
        )
        with pytest.raises(TimedOut):
            trusting.propose(timeout=8, **refund(third))

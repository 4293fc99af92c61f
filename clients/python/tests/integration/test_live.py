"""The client against a running Airlock (broker, processor, connector worker, reference
ledger), started by the Rust test ``tests/tests/python_client.rs``, which passes:

* ``AIRLOCK_TEST_BROKERS``, ``AIRLOCK_TEST_PREFIX``: where Airlock's topics are;
* ``AIRLOCK_TEST_REPORT``: a file to list the operation keys seen COMMITTED, one per line;
  the Rust test checks the ledger holds exactly one effect for each.
"""

import asyncio
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from airlock_client import AsyncClient, CanonicalError, Client, Refused

BROKERS = os.environ["AIRLOCK_TEST_BROKERS"]
PREFIX = os.environ["AIRLOCK_TEST_PREFIX"]
RUN = uuid.uuid4().hex[:8]


def refund(key, minor_units, **overrides):
    call = dict(
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
    call.update(overrides)
    return call


def committed(*keys):
    with open(os.environ["AIRLOCK_TEST_REPORT"], "a", encoding="utf-8") as report:
        for key in keys:
            report.write(key + "\n")


@pytest.fixture(scope="module")
def client():
    with Client(BROKERS, topic_prefix=PREFIX) as c:
        yield c


def test_a_refund_is_accepted_then_committed_once_however_often_it_is_sent(client):
    key = f"refund:py-{RUN}-1"
    first = client.propose(**refund(key, 1250))
    assert (first.verdict, first.reason) == ("ACCEPTED", "AUTO_APPROVED"), first
    assert not first.earlier
    assert first.arguments_hash is not None and first.epoch == 1

    # The same proposal again (a blind retry): answered from before, not published again.
    again = client.propose(**refund(key, 1250))
    assert again.earlier and again.decision_id == first.decision_id

    settled = client.wait_settled(key, timeout=120)
    assert settled.final and settled.decision.verdict == "COMMITTED", settled
    assert settled.decision.receipt is not None
    assert settled.result is not None, "the connector's evidence is handed back"
    committed(key)

    # Sent again after it settled: still its own answer (ACCEPTED), not the settlement that
    # also replies to it; and the same arguments built in another key order are the same
    # proposal, not a reuse of its id.
    reordered = refund(key, 1250)
    reordered["arguments"] = dict(reversed(list(reordered["arguments"].items())))
    for call in (refund(key, 1250), reordered):
        late = client.propose(**call)
        assert late.earlier and late.decision_id == first.decision_id, late

    # A new proposal of the key (another logical call, so another id) is a DUPLICATE.
    retry = client.propose(**refund(key, 1250, logical_call_id="another"))
    assert retry.verdict == "DUPLICATE", retry


def test_refusals_are_typed_and_carry_the_decision(client):
    key = f"refund:py-{RUN}-2"
    client.propose(**refund(key, 300))
    with pytest.raises(Refused) as conflict:
        client.propose(**refund(key, 301))
    assert conflict.value.decision.verdict == "CONFLICT"
    with pytest.raises(Refused) as unknown:
        client.propose(**refund(f"refund:py-{RUN}-3", 300, tool="no_such_tool"))
    assert unknown.value.decision.reason == "UNKNOWN_TOOL"
    assert client.wait_settled(key, timeout=120).decision.verdict == "COMMITTED"
    committed(key)


def test_arguments_without_a_canonical_form_are_refused_before_sending(client):
    with pytest.raises(CanonicalError) as refused:
        client.propose(**refund(f"refund:py-{RUN}-4", 100, arguments='{"amount": 1.5}'))
    assert refused.value.kind == "non_integer" and refused.value.path == "/amount"


def test_threads_share_one_client(client):
    keys = [f"refund:py-{RUN}-t{i}" for i in range(8)]
    answers, errors = {}, []

    def propose(key):
        try:
            answers[key] = client.propose(**refund(key, 500))
        except Exception as e:  # collected and reported below
            errors.append((key, e))

    threads = [threading.Thread(target=propose, args=(k,)) for k in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert {a.verdict for a in answers.values()} == {"ACCEPTED"}
    for key in keys:
        assert client.wait_settled(key, timeout=120).decision.verdict == "COMMITTED"
    committed(*keys)


def test_asyncio_and_two_clients_publishing_the_same_call():
    key = f"refund:py-{RUN}-a"

    async def main():
        async with AsyncClient(BROKERS, topic_prefix=PREFIX) as one, AsyncClient(
            BROKERS, topic_prefix=PREFIX
        ) as two:
            # Two processes of a fleet sending the same call at once: one effect.
            a, b = await asyncio.gather(
                one.propose(**refund(key, 700)), two.propose(**refund(key, 700))
            )
            assert a.decision_id == b.decision_id and a.verdict == "ACCEPTED"
            return await one.wait_settled(key, final=True, timeout=120)

    settled = asyncio.run(main())
    assert settled.decision.verdict == "COMMITTED"
    committed(key)


def test_the_readme_example_runs_as_printed():
    example = Path(__file__).with_name("readme_example.py")
    out = subprocess.run(
        [sys.executable, str(example)],
        env={**os.environ, "AIRLOCK_BROKERS": BROKERS, "AIRLOCK_PREFIX": PREFIX},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "ACCEPTED AUTO_APPROVED", out.stdout
    assert lines[1].startswith("COMMITTED True HTTP 2"), out.stdout
    assert '"reference":"refund:txn_1"' in lines[1], out.stdout
    committed("refund:txn_1")


# One process of a fleet: proposes every call of argv[3:] (operation keys), prints each
# verdict. Run several at once on the same keys.
FLEET_MEMBER = """
import sys
from airlock_client import Client
brokers, prefix, run, *keys = sys.argv[1:]
with Client(brokers, topic_prefix=prefix) as airlock:
    for key in keys:
        d = airlock.propose(
            tool="refund", operation_key=key,
            arguments={"tenant_id": "acme", "account_id": "acct-42",
                       "amount": {"minor_units": 321, "currency": "EUR"}},
            tenant="acme", principal="agent-support-1", run_id=run, logical_call_id=key,
        )
        print(key, d.verdict, d.epoch, flush=True)
"""


def test_processes_of_a_fleet_sending_the_same_intents_at_once():
    keys = [f"refund:py-{RUN}-fleet-{i}" for i in range(6)]
    members = [
        subprocess.Popen(
            # Each process walks the keys in its own order, so they overlap in time.
            [sys.executable, "-c", FLEET_MEMBER, BROKERS, PREFIX, f"run-{RUN}-fleet"]
            + keys[i:] + keys[:i],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    answered = {}
    for member in members:
        out, err = member.communicate(timeout=180)
        assert member.returncode == 0, err
        for line in out.splitlines():
            key, verdict, epoch = line.split()
            answered.setdefault(key, []).append((verdict, epoch))
    # Every proposal of every process answered, all about the same first attempt.
    assert sorted(answered) == sorted(keys)
    for key, answers in answered.items():
        assert len(answers) == 3, (key, answers)
        # An answer that names an attempt names the first one (a DUPLICATE of a proposal
        # still being decided may name none).
        assert {epoch for _, epoch in answers if epoch != "None"} == {"1"}, (key, answers)
        assert {verdict for verdict, _ in answers} <= {"ACCEPTED", "DUPLICATE", "IN_PROGRESS"}
    with Client(BROKERS, topic_prefix=PREFIX) as client:
        for key in keys:
            assert client.wait_settled(key, timeout=120).decision.verdict == "COMMITTED"
    # The Rust test checks the ledger holds exactly one effect for each.
    committed(*keys)


def test_a_fenced_run_refuses_its_stale_owner_on_every_partition(client):
    run = f"run-{RUN}-fenced"
    answers = client.fence_run(run, 5, "orchestrator-1", timeout=120)
    assert sorted(answers) == list(range(client.partitions))
    assert all(d.reason == "FENCE_ADVANCED" for d in answers.values()), answers
    # The old owner, at fence 4, on a key of every partition: refused everywhere.
    keys = {}
    i = 0
    while len(keys) < client.partitions:
        key = f"refund:py-{RUN}-stale-{i}"
        keys.setdefault(client.partition(key), key)
        i += 1
    for key in keys.values():
        with pytest.raises(Refused) as refused:
            client.propose(**refund(key, 100, run_id=run, lease_fence=4))
        assert refused.value.decision.reason == "STALE_FENCE", refused.value.decision
    # Its own lower fence is refused too, naming the accepted one.
    with pytest.raises(Refused) as refused:
        client.fence_run(run, 4, "orchestrator-0", timeout=120)
    assert refused.value.decision.reason == "STALE_FENCE"
    assert "accepted fence 5" in refused.value.decision.detail

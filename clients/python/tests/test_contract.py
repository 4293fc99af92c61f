"""The client contract, byte for byte against the vectors the processor's own code writes
(schemas/vectors/client.json)."""

import datetime
from pathlib import Path

import pytest

from airlock_client import (
    CanonicalError,
    FenceFilter,
    MarkerVerifier,
    canonicalize,
    content_id,
    derive_proposal_id,
    fence_message,
    idempotency_key,
    murmur2,
    partition_for,
)
from airlock_client import codec
from airlock_client.client import proposal_fingerprint

from conftest import REPO


def test_canonical_forms_and_refusals(vectors):
    for case in vectors["canonical"]:
        if "canonical" in case:
            c = canonicalize(case["input"])
            assert (c.json, c.hash) == (case["canonical"], case["hash"]), case["name"]
        else:
            with pytest.raises(CanonicalError) as refused:
                canonicalize(case["input"])
            assert refused.value.kind == case["error"], case["name"]
            if case["path"] is not None:
                assert refused.value.path == case["path"], case["name"]


def test_python_sort_keys_is_not_canonical(vectors):
    # The reason the client sorts by UTF-16 code units itself.
    import json

    case = next(c for c in vectors["canonical"] if c["name"] == "utf-16 order")
    naive = json.dumps(json.loads(case["input"]), sort_keys=True, separators=(",", ":"),
                       ensure_ascii=False)
    assert naive != case["canonical"]


def test_far_too_deep_documents_are_refused_with_their_path():
    deep = "[" * 10_000 + "]" * 10_000
    with pytest.raises(CanonicalError) as refused:
        canonicalize(deep)
    assert refused.value.kind == "too_deep"
    assert refused.value.path == "/0" * 64


def test_partitions(vectors):
    for case in vectors["partitions"]:
        key = case["key"].encode("utf-8")
        assert murmur2(key) == case["murmur2"], case
        assert partition_for(key, case["partitions"]) == case["partition"], case


def _plain(value):
    """A decoded record with timestamps as epoch milliseconds, as the vectors hold them."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, datetime.datetime):
        return int(value.timestamp() * 1000)
    return value


def test_avro_payloads_in_both_framings(vectors):
    for case in vectors["avro"]:
        record, value = case["record"], case["value"]
        single = bytes.fromhex(case["single_object"])
        confluent = bytes.fromhex(case["confluent"])
        schema_id = case["confluent_schema_id"]
        assert codec.encode(record, value) == single, record
        assert codec.encode(record, value, schema_id=schema_id) == confluent, record
        assert _plain(codec.decode(record, single)) == value, record
        ids = {schema_id: (record, 1)}
        assert _plain(codec.decode(record, confluent, schema_ids=ids)) == value, record


def test_bad_payloads_are_refused_with_a_reason(vectors):
    case = next(c for c in vectors["avro"] if c["record"] == "Decision")
    single = bytes.fromhex(case["single_object"])
    for payload, why in [
        (single + b"\x00", "trailing"),
        (single[:-3], "decode"),
        (b"\xc3\x01" + b"\xff" * 8 + single[10:], "unknown schema fingerprint"),
        (b"{}", "not an Airlock payload"),
        (bytes.fromhex(case["confluent"]), "unknown Confluent schema id"),
        (b"\xc3\x01" + b"\x00" * (codec.MAX_PAYLOAD_BYTES), "limit"),
    ]:
        with pytest.raises(codec.CodecError, match=why):
            codec.decode("Decision", payload)
    with pytest.raises(codec.CodecError, match="not a Outcome"):
        codec.decode("Outcome", single)


def test_the_fence(vectors):
    for case in vectors["fence"]:
        f = FenceFilter()
        got = []
        for r in case["records"]:
            headers = []
            if r["kind"] is not None:
                headers.append(("airlock-kind", r["kind"].encode()))
            if r["owner_epoch"] is not None:
                headers.append(("airlock-owner-epoch", r["owner_epoch"].encode()))
            got.append(f.admit("t", 0, headers).verdict)
        assert got == case["verdicts"], case["name"]


def test_signed_fence_markers(vectors):
    signed = vectors["fence_signatures"]
    verify = MarkerVerifier([bytes.fromhex(signed["verifying_key"])])
    for m in signed["markers"]:
        topic, partition, epoch = m["topic"], m["partition"], m["owner_epoch"]
        capability = bytes.fromhex(m["capability"])
        assert fence_message(topic, partition, epoch).hex() == m["message"], m
        assert verify(topic, partition, epoch, capability), m
        assert not verify(topic, partition, epoch + 1, capability), m
        assert not verify(topic + "x", partition, epoch, capability), m
        assert not verify(topic, partition, epoch, None), m
        assert not verify(topic, partition, epoch, b"\x02" + capability[1:]), m
    # A reader with the key: an unsigned marker of a huge epoch raises no fence, a signed one
    # does, and the answers behind it stay readable.
    m = signed["markers"][0]
    f = FenceFilter(verify)
    topic, partition, epoch = m["topic"], m["partition"], m["owner_epoch"]
    forged = [("airlock-kind", b"fence"), ("airlock-owner-epoch", b"999999")]
    assert f.admit(topic, partition, forged).verdict == "forged"
    genuine = [
        ("airlock-kind", b"fence"),
        ("airlock-owner-epoch", str(epoch).encode()),
        ("airlock-capability", bytes.fromhex(m["capability"])),
    ]
    assert f.admit(topic, partition, genuine).verdict == "marker"
    answer = [("airlock-kind", b"decision"), ("airlock-owner-epoch", str(epoch).encode())]
    assert f.admit(topic, partition, answer).verdict == "accept"
    assert f.admit(topic, partition, [("airlock-owner-epoch", b"4")]).verdict == "fenced"


def test_derived_ids(vectors):
    ids = vectors["ids"]
    for case in ids["idempotency_keys"]:
        assert idempotency_key(case["operation_key"]) == case["idempotency_key"]
    assert content_id("propose", ids["proposal_id"]["parts"]) == ids["proposal_id"]["id"]
    plain = ids["proposal_id"]
    assert derive_proposal_id("acme", plain["parts"][0], plain["parts"]) == plain["id"]
    scoped = ids["scoped_proposal_id"]
    assert (
        derive_proposal_id(scoped["tenant"], scoped["operation_key"], scoped["parts"])
        == scoped["id"]
    )
    fp = ids["proposal_fingerprint"]
    assert proposal_fingerprint(fp["proposal"]) == fp["fingerprint"]


def test_the_packaged_schemas_are_the_repositorys():
    packaged = Path(codec.__file__).parent / "schemas"
    for record in codec.RECORDS:
        ours = sorted(p.name for p in (packaged / record).iterdir())
        theirs = sorted(p.name for p in (REPO / "schemas/avro/history" / record).iterdir())
        assert ours == theirs, record
        for name in ours:
            assert (packaged / record / name).read_bytes() == (
                REPO / "schemas/avro/history" / record / name
            ).read_bytes(), f"{record}/{name}"

"""Publishing proposals to Airlock and waiting for its answers.

A :class:`Client` owns one Kafka producer and one reader thread. The reader reads the
decisions (and outcomes) partitions of the operation keys this client asked about, each from
its start (the owner-epoch fence needs every marker), then follows them; it keeps a bounded
index of the answers it read. A call waits only on that index, so many threads can share one
client, and many processes can publish for the same keys at once: an answer is matched to a
proposal by its id, and the id is derived from the proposal's content.

Every wait is bounded by a timeout; a partition is read from its start once per client, so
keep clients long-lived.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition

from . import codec
from .canonical import canonicalize
from .fence import ACCEPT, BARRIER_KIND, FORGED, KIND, FenceFilter, MarkerVerifier
from .partitioner import LIBRDKAFKA_PARTITIONER, partition_for
from .registry import RegistryError, SchemaRegistry, topic_subject

log = logging.getLogger("airlock_client")

#: Verdicts of a proposal that are not refusals.
NOT_REFUSED = ("ACCEPTED", "PENDING_APPROVAL", "DUPLICATE", "IN_PROGRESS")
#: Verdicts that say how an effect ended (UNKNOWN: not yet known; it is reconciled).
SETTLING = ("COMMITTED", "FAILED", "UNKNOWN", "EXPIRED", "CANCELLED")
#: Of those, the ones after which nothing changes for the attempt.
FINAL = ("COMMITTED", "FAILED", "EXPIRED", "CANCELLED")
#: The verdict each connector outcome kind settles an attempt with.
_SETTLED_BY = {
    "COMMITTED": "COMMITTED",
    "RECONCILED_COMMITTED": "COMMITTED",
    "FAILED": "FAILED",
    "RECONCILED_FAILED": "FAILED",
}


class AirlockError(Exception):
    """Base of this package's errors."""


class Refused(AirlockError):
    """The processor refused the proposal; ``decision`` says why (``reason``, ``detail``)."""

    def __init__(self, decision: "Decision"):
        super().__init__(
            f"{decision.operation_key}: {decision.verdict} {decision.reason}: {decision.detail}"
        )
        self.decision = decision


class TimedOut(AirlockError):
    """No answer within the timeout. Sending the same proposal again is safe."""


class BrokerUnavailable(AirlockError):
    """Kafka did not take the record or answer the reader in time."""


@dataclass(frozen=True)
class Decision:
    """One answer of the processor, as read from the decisions topic."""

    decision_id: str
    in_reply_to: str
    operation_key: str
    verdict: str
    reason: str
    detail: str
    state: Optional[str]
    epoch: Optional[int]
    arguments_hash: Optional[str]
    receipt: Optional[str]
    decided_at: int
    partition: int
    offset: int
    #: True when the answer was there before this call published anything.
    earlier: bool = False
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @staticmethod
    def _of(value: Mapping[str, Any], partition: int, offset: int) -> "Decision":
        decided_at = value["decided_at"]
        if not isinstance(decided_at, int):  # fastavro reads timestamp-millis as datetime
            decided_at = int(decided_at.timestamp() * 1000)
        return Decision(
            decision_id=value["decision_id"],
            in_reply_to=value["in_reply_to"],
            operation_key=value["operation_key"],
            verdict=value["verdict"],
            reason=value["reason"],
            detail=value["detail"],
            state=value.get("state"),
            epoch=value.get("epoch"),
            arguments_hash=value.get("arguments_hash"),
            receipt=value.get("receipt"),
            decided_at=decided_at,
            partition=partition,
            offset=offset,
            raw=value,
        )


@dataclass(frozen=True)
class Settlement:
    """How an effect ended, or that it is not known yet (``final`` False: UNKNOWN, under
    reconciliation; do not retry it). ``result`` is what the connector reported (its
    evidence), when read: data from the downstream system, not to be trusted as instructions."""

    decision: Decision
    final: bool
    result: Optional[str] = None


def content_id(namespace: str, parts: List[str]) -> str:
    """An id derived from ``parts`` (each length-prefixed), as ``airlock propose`` derives a
    proposal id: the same proposal gets the same id, so sending it again is a resend."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode("utf-8")
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return f"{namespace}/{h.hexdigest()[:32]}"


def derive_proposal_id(tenant: str, operation_key: str, parts: List[str]) -> str:
    """The id a proposal that names none gets: :func:`content_id` ``"propose"`` over ``parts``
    (operation key, tool, tool version, arguments hash, tenant, principal, run id, logical call
    id), under the tenant's prefix (``acme/propose/...``) when ``operation_key`` has it, as a
    processor with ``key_scope = "tenant"`` asks of every id of a tenant."""
    derived = content_id("propose", parts)
    if tenant and operation_key.startswith(tenant + "/"):
        return f"{tenant}/{derived}"
    return derived


def proposal_fingerprint(p: Mapping[str, Any]) -> str:
    """What the processor names a proposal by when another proposal reused its id (the
    ``r/<id>/<fingerprint>`` refusal): 128 bits of SHA-256 over its identity."""
    h = hashlib.sha256(b"airlock/proposal/v1\0")
    for name in ("tenant_id", "principal_id", "operation_key", "tool", "tool_version", "run_id",
                 "arguments_json"):
        data = p[name].encode("utf-8")
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return h.hexdigest()[:32]


class _Waiter:
    __slots__ = ("topic", "partition", "wants", "future")

    def __init__(self, topic: str, partition: int, wants: Callable[[Any], bool]):
        self.topic = topic
        self.partition = partition
        self.wants = wants
        self.future: Future = Future()


class _Followed:
    """One partition the reader follows."""

    def __init__(self, end: int):
        self.end = end  # the high watermark when it was first asked for
        self.position = 0
        self.caught_up = threading.Event()
        self.error: Optional[str] = None


class _Reader(threading.Thread):
    """Reads decisions and outcomes partitions from their start, then follows them."""

    def __init__(
        self,
        config: Dict[str, Any],
        decisions: str,
        outcomes: str,
        capacity: int,
        verify: Optional[MarkerVerifier] = None,
        schema_ids: Optional[Mapping[int, Tuple[str, int]]] = None,
    ):
        super().__init__(name="airlock-reader", daemon=True)
        self.consumer = Consumer(config)
        # The Confluent ids this reader accepts (a processor with schema_registry.framing =
        # "confluent" writes decisions with them).
        self.schema_ids = dict(schema_ids or {})
        self.decisions = decisions
        self.outcomes = outcomes
        self.capacity = capacity
        self.lock = threading.Lock()
        self.followed: Dict[Tuple[str, int], _Followed] = {}
        self.pending: List[Tuple[str, int]] = []
        self.fence = FenceFilter(verify)
        # Bounded indexes: answers by the id they reply to, decisions by operation key,
        # outcome evidence by (operation key, epoch). Oldest entries go first.
        self.replies: "OrderedDict[str, List[Decision]]" = OrderedDict()
        self.by_key: "OrderedDict[str, List[Decision]]" = OrderedDict()
        self.evidence: "OrderedDict[Tuple[str, int, str], str]" = OrderedDict()
        self.evicted = False
        self.unreadable: Dict[Tuple[str, int], str] = {}
        self.waiters: List[_Waiter] = []
        self.stop = threading.Event()
        self.failure: Optional[str] = None

    # -- called by client threads ------------------------------------------------------------

    def follow(self, topic: str, partition: int, timeout: float) -> None:
        """Returns once ``topic``'s ``partition`` has been read up to where it ended when it
        was first asked for."""
        with self.lock:
            if self.failure:
                raise BrokerUnavailable(self.failure)
            state = self.followed.get((topic, partition))
            if state is None:
                state = self.followed[(topic, partition)] = _Followed(end=-1)
                self.pending.append((topic, partition))
        if not state.caught_up.wait(timeout):
            raise TimedOut(
                f"reading {topic} partition {partition} up to offset {state.end} took over "
                f"{timeout:.0f}s (is the broker up?)"
            )
        if state.error:
            raise BrokerUnavailable(state.error)

    def wait(self, waiter: _Waiter, check: Callable[[], Any]) -> Future:
        """Registers ``waiter``, then resolves it at once when ``check`` (run under the lock,
        so no record slips between the two) finds an answer."""
        with self.lock:
            if self.failure:
                raise BrokerUnavailable(self.failure)
            found = check()
            if found is not None:
                waiter.future.set_result(found)
            else:
                self.waiters.append(waiter)
        return waiter.future

    def forget(self, waiter: _Waiter) -> None:
        with self.lock:
            if waiter in self.waiters:
                self.waiters.remove(waiter)

    # -- the thread ----------------------------------------------------------------------------

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self._assign_pending()
                message = self.consumer.poll(0.2)
                if message is None:
                    self._check_caught_up()
                    continue
                error = message.error()
                if error is not None:
                    if error.fatal():
                        self._fail(f"reading answers: {error}")
                        return
                    continue
                self._take(message)
        except Exception as e:  # the reader must never die silently
            self._fail(f"the answer reader stopped: {e!r}")
        finally:
            self.consumer.close()

    def _fail(self, why: str) -> None:
        with self.lock:
            self.failure = why
            waiters, self.waiters = self.waiters, []
            for state in self.followed.values():
                state.error = state.error or why
                state.caught_up.set()
        for w in waiters:
            if not w.future.done():
                w.future.set_exception(BrokerUnavailable(why))

    def _assign_pending(self) -> None:
        with self.lock:
            pending, self.pending = self.pending, []
        for topic, partition in pending:
            state = self.followed[(topic, partition)]
            try:
                low, high = self.consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=10, cached=False
                )
                self.consumer.incremental_assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
            except KafkaException as e:
                with self.lock:
                    # Asked again by the next call that needs it.
                    del self.followed[(topic, partition)]
                state.error = f"reading {topic} partition {partition}: {e}"
                state.caught_up.set()
                continue
            state.end = high
            state.position = low
            if high <= low:
                state.caught_up.set()

    def _check_caught_up(self) -> None:
        with self.lock:  # client threads add partitions meanwhile
            followed = list(self.followed.items())
        waiting = [(key, s) for key, s in followed if s.end >= 0 and not s.caught_up.is_set()]
        if not waiting:
            return
        positions = self.consumer.position([TopicPartition(t, p) for (t, p), _ in waiting])
        for tp, (_, state) in zip(positions, waiting):
            if tp.offset >= state.end:
                state.caught_up.set()

    def _take(self, message: Any) -> None:
        topic, partition, offset = message.topic(), message.partition(), message.offset()
        headers = message.headers() or []
        state = self.followed.get((topic, partition))
        if state is not None:
            state.position = offset + 1
        barrier = any(k == KIND and v == BARRIER_KIND for k, v in headers)
        admitted = self.fence.admit(topic, partition, headers)
        if admitted.verdict == FORGED:
            log.warning(
                "%s partition %d offset %d: a fence marker (owner epoch %s) that does not "
                "verify under the processor's keys: ignored",
                topic,
                partition,
                offset,
                admitted.owner_epoch,
            )
        if not barrier and admitted.verdict == ACCEPT and message.value() is not None:
            if topic == self.decisions:
                self._take_decision(message.value(), partition, offset)
            elif topic == self.outcomes:
                self._take_outcome(message.value())
        if state is not None and state.position >= state.end:
            state.caught_up.set()

    def _take_decision(self, payload: bytes, partition: int, offset: int) -> None:
        try:
            decision = Decision._of(
                codec.decode("Decision", payload, self.schema_ids), partition, offset
            )
        except codec.CodecError as e:
            # Never written by a processor this client understands: a newer schema (upgrade
            # the client) or a stranger's record. Kept to explain a wait that times out.
            with self.lock:
                self.unreadable[(self.decisions, partition)] = f"offset {offset}: {e}"
            return
        with self.lock:
            self._index(self.replies, decision.in_reply_to, decision)
            self._index(self.by_key, decision.operation_key, decision)
            self._resolve(self.decisions, partition, decision)

    def _take_outcome(self, payload: bytes) -> None:
        try:
            outcome = codec.decode("Outcome", payload, self.schema_ids)
        except codec.CodecError:
            return
        settled = _SETTLED_BY.get(outcome["kind"])
        if settled is None or outcome.get("evidence") is None:
            return
        with self.lock:
            key = (outcome["operation_key"], outcome["epoch"], settled)
            self.evidence[key] = outcome["evidence"]
            self.evidence.move_to_end(key)
            while len(self.evidence) > self.capacity:
                self.evidence.popitem(last=False)
                self.evicted = True

    def _index(self, index: "OrderedDict[str, List[Decision]]", key: str, d: Decision) -> None:
        entries = index.setdefault(key, [])
        entries.append(d)
        del entries[:-32]  # the latest few per key are what any caller asks about
        index.move_to_end(key)
        while len(index) > self.capacity:
            index.popitem(last=False)
            self.evicted = True

    def _resolve(self, topic: str, partition: int, decision: Decision) -> None:
        still = []
        for w in self.waiters:
            if w.topic == topic and w.partition == partition and w.wants(decision):
                if not w.future.done():
                    w.future.set_result(decision)
            else:
                still.append(w)
        self.waiters = still


class Client:
    """A client of one Airlock deployment.

    ``bootstrap_servers``: the Kafka brokers. ``topic_prefix``: Airlock's ``topics.prefix``.
    ``partitions``: the topics' partition count (read from the broker when not given).
    ``kafka``: extra librdkafka settings for both the producer and the reader (security, SASL).
    ``capacity``: how many operation keys' answers the reader keeps in memory.
    ``schema_id``: publish in the Confluent wire format with this registry id of the
    ToolProposal schema instead of Avro single-object encoding.
    ``schema_registry_url``: publish in the Confluent wire format with the id a
    Confluent-compatible schema registry gives the ToolProposal schema under the subject
    ``<topic_prefix>proposals-value`` (looked up once, at construction; the processor must run
    with the same ``schema_registry.url``); ``register_schema=True`` registers it when the
    subject lacks it (``airlock topics create`` normally does). Not with ``schema_id``. The
    ids of the Decision and Outcome schemas are looked up too, so that decisions a processor
    writes in the Confluent framing (``schema_registry.framing = "confluent"``) are read.
    ``verifying_keys``: the processor's capability verifying keys (paths of the ``.pub``
    files ``airlock keygen`` writes, or 32 key bytes; several during a rotation). With them, a
    fence marker raises the reader's fence only when its signature verifies, so that a forged
    marker cannot hide every later answer; needs the ``cryptography`` package
    (``pip install 'airlock-client[verify]'``).
    """

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        topic_prefix: str = "airlock.",
        partitions: Optional[int] = None,
        kafka: Optional[Mapping[str, Any]] = None,
        capacity: int = 100_000,
        schema_id: Optional[int] = None,
        schema_registry_url: Optional[str] = None,
        register_schema: bool = False,
        timeout: float = 30.0,
        verifying_keys: Optional[Sequence[Union[str, bytes, "os.PathLike[str]"]]] = None,
    ):
        verify = MarkerVerifier(verifying_keys) if verifying_keys else None
        common: Dict[str, Any] = {"bootstrap.servers": bootstrap_servers}
        common.update(kafka or {})
        self.proposals = f"{topic_prefix}proposals"
        self.decisions = f"{topic_prefix}decisions"
        self.outcomes = f"{topic_prefix}outcomes"
        self.control = f"{topic_prefix}control"
        schema_ids: Dict[int, Tuple[str, int]] = {}
        if schema_registry_url:
            if schema_id is not None:
                raise ValueError("give schema_id or schema_registry_url, not both")
            registry = SchemaRegistry(schema_registry_url, timeout=min(timeout, 10.0))
            schema_id = registry.schema_id(
                topic_subject(self.proposals), "ToolProposal", register=register_schema
            )
            # What the processor and the connector workers may write in the Confluent framing.
            # A registry without them (an older Airlock registered its schemas) is no reason
            # not to start: answers written single-object are read all the same.
            for topic, record in ((self.decisions, "Decision"), (self.outcomes, "Outcome")):
                try:
                    schema_ids[registry.schema_id(topic_subject(topic), record)] = (
                        record,
                        codec.current_version(record),
                    )
                except RegistryError as e:
                    log.warning("answers in the Confluent framing will not be read: %s", e)
        self.schema_id = schema_id
        self._producer = Producer(
            {
                **common,
                "enable.idempotence": True,
                "acks": "all",
                "partitioner": LIBRDKAFKA_PARTITIONER,
            }
        )
        if partitions is None:
            partitions = self._partition_count(timeout)
        self.partitions = partitions
        self._reader = _Reader(
            {
                **common,
                "group.id": f"{topic_prefix}client",
                "enable.auto.commit": False,
                "enable.partition.eof": False,
                "isolation.level": "read_committed",
            },
            self.decisions,
            self.outcomes,
            capacity,
            verify,
            schema_ids,
        )
        self._reader.start()

    def _partition_count(self, timeout: float) -> int:
        try:
            metadata = self._producer.list_topics(timeout=timeout)
        except KafkaException as e:
            raise BrokerUnavailable(f"reading the topics' metadata: {e}") from None
        counts = {}
        for topic in (self.proposals, self.decisions, self.outcomes):
            found = metadata.topics.get(topic)
            if found is None or found.error is not None:
                raise AirlockError(
                    f"topic {topic} not found (is `airlock topics create` done, and the "
                    "prefix right?)"
                )
            counts[topic] = len(found.partitions)
        if len(set(counts.values())) != 1:
            raise AirlockError(f"Airlock's topics are not co-partitioned: {counts}")
        return counts[self.proposals]

    def close(self) -> None:
        """Stops the reader and sends what is still queued."""
        self._reader.stop.set()
        self._reader.join(timeout=10)
        self._producer.flush(10)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def partition(self, operation_key: str) -> int:
        """The partition of ``operation_key`` on every Airlock topic."""
        return partition_for(operation_key.encode("utf-8"), self.partitions)

    def proposal(
        self,
        *,
        tool: str,
        operation_key: str,
        arguments: Union[str, Mapping[str, Any]],
        tenant: str,
        principal: str,
        run_id: str,
        logical_call_id: str,
        tool_version: str = "1",
        lease_owner: Optional[str] = None,
        lease_fence: int = 1,
        deadline_seconds: float = 3600,
        provider_call_id: Optional[str] = None,
        proposal_id: Optional[str] = None,
        now_ms: Optional[int] = None,
    ) -> Dict[str, Any]:
        """The ToolProposal record for a call, without sending it. ``arguments`` is a JSON
        text or a mapping; it must have a canonical form (:class:`CanonicalError` if not)."""
        text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        # The canonical text goes on the wire: the processor tells a resend from a reuse of the
        # id by the raw text, so two processes that build the same arguments in another key
        # order must send the same bytes.
        canonical = canonicalize(text)
        text, digest = canonical.json, canonical.hash
        if proposal_id is None:
            proposal_id = derive_proposal_id(
                tenant,
                operation_key,
                [operation_key, tool, tool_version, digest, tenant, principal, run_id,
                 logical_call_id],
            )
        now = int(time.time() * 1000) if now_ms is None else now_ms
        return {
            "proposal_id": proposal_id,
            "operation_key": operation_key,
            "run_id": run_id,
            "logical_call_id": logical_call_id,
            "provider_call_id": provider_call_id,
            "tenant_id": tenant,
            "principal_id": principal,
            "tool": tool,
            "tool_version": tool_version,
            "arguments_json": text,
            "arguments_hash": digest,
            "lease_owner": run_id if lease_owner is None else lease_owner,
            "lease_fence": lease_fence,
            "deadline_at": now + int(deadline_seconds * 1000),
            "proposed_at": now,
        }

    def propose(self, timeout: float = 60.0, **call: Any) -> Decision:
        """Publishes a tool proposal (the arguments of :meth:`proposal`) and returns the
        processor's answer: ACCEPTED (dispatched), PENDING_APPROVAL, DUPLICATE or IN_PROGRESS
        (an earlier proposal of the key). Raises :class:`Refused` with the decision for any
        other answer, :class:`TimedOut`, :class:`BrokerUnavailable`.

        A proposal answered before (the same content, so the same id) is not published again:
        its earlier answer is returned with ``earlier`` set."""
        return self.send(self.proposal(**call), timeout=timeout)

    def send(self, proposal: Mapping[str, Any], timeout: float = 60.0) -> Decision:
        """:meth:`propose` for a proposal record built already."""
        deadline = time.monotonic() + timeout
        key = proposal["operation_key"]
        pid = proposal["proposal_id"]
        ours = f"r/{pid}/{proposal_fingerprint(proposal)}"
        partition = self.partition(key)
        payload = codec.encode("ToolProposal", proposal, self.schema_id)
        self._reader.follow(self.decisions, partition, _left(deadline))

        def wants(d: Decision) -> bool:
            # The proposal's own answer: `p/<id>`, `x/...` (refused before it was decided), or
            # the refusal of this very content as a reuse of the id. Not a later settlement of
            # its intent (`e/...` replies to the proposal too), nor the refusal of another
            # proposal that reused the id.
            return (
                d.in_reply_to == pid
                and d.partition == partition
                and d.operation_key == key
                and (
                    d.decision_id == f"p/{pid}"
                    or d.decision_id.startswith("x/")
                    or d.decision_id == ours
                )
            )

        waiter = _Waiter(self.decisions, partition, wants)

        def earlier() -> Optional[Decision]:
            for d in reversed(self._reader.replies.get(pid, [])):
                if wants(d):
                    return dataclasses.replace(d, earlier=True)
            return None

        future = self._reader.wait(waiter, earlier)
        if not future.done():
            self._produce(self.proposals, partition, key, payload, deadline)
        decision = self._await(future, waiter, deadline, f"the answer to {pid}")
        if decision.verdict not in NOT_REFUSED:
            raise Refused(decision)
        return decision

    def fence_run(
        self, run_id: str, fence: int, operator: str, *, timeout: float = 60.0
    ) -> Dict[int, Decision]:
        """Raises ``run_id``'s lease fence to ``fence`` on every partition, as ``airlock runs
        fence`` does, and returns each partition's answer once every partition has recorded it.

        A proposal raises its run's fence only on its own partition; a new owner of a run calls
        this before the run's first new proposal, so that every partition refuses the old
        owner's proposals (STALE_FENCE) wherever their keys land. ``operator``: the principal
        raising it (journaled). Always published, also when the same fence was raised before
        (a newer owner may have raised it since). Raises :class:`Refused` with a partition's
        refusal (STALE_FENCE: a newer owner fenced the run higher) after every partition
        answered, :class:`TimedOut` when one does not answer in time, and
        :class:`BrokerUnavailable`. The record leaves unsigned: a processor that requires
        ``operator``'s signature refuses it (use ``airlock runs fence --signing-key``)."""
        deadline = time.monotonic() + timeout
        control_id = content_id("fence", [run_id, str(fence), operator])
        payload = codec.encode(
            "Control",
            {
                "control_id": control_id,
                "kind": "LEASE_FENCE",
                "operation_key": None,
                "run_id": run_id,
                "lease_fence": fence,
                "operator_id": operator,
                "evidence": None,
                "issued_at": int(time.time() * 1000),
            },
        )
        pending: Dict[int, Tuple[Future, _Waiter]] = {}
        try:
            for partition in range(self.partitions):
                self._reader.follow(self.decisions, partition, _left(deadline))

                def wants(d: Decision, partition: int = partition) -> bool:
                    # The processor's answer to this control (`c/<id>`, or `x/...` when it was
                    # dead-lettered), not the refusal of another record naming its id.
                    return (
                        d.in_reply_to == control_id
                        and d.partition == partition
                        and (d.decision_id == f"c/{control_id}" or d.decision_id.startswith("x/"))
                    )

                waiter = _Waiter(self.decisions, partition, wants)
                # Only an answer read from now on: an earlier one to the same fence proves
                # nothing.
                pending[partition] = (self._reader.wait(waiter, lambda: None), waiter)
                self._produce(self.control, partition, run_id, payload, deadline)
            answers = {
                partition: self._await(
                    future, waiter, deadline, f"partition {partition}'s answer to {control_id}"
                )
                for partition, (future, waiter) in pending.items()
            }
        finally:
            for _, waiter in pending.values():
                self._reader.forget(waiter)
        for decision in answers.values():
            if decision.reason != "FENCE_ADVANCED":
                raise Refused(decision)
        return answers

    def latest_reply(self, answer: Decision) -> Decision:
        """The latest decision about ``answer``'s operation key after it (an approval's
        dispatch, an approval rejected or expired, a settlement: these reply to the intent's
        first proposal, whichever proposal this was), from what the reader has read;
        ``answer`` itself when nothing came after it."""
        with self._reader.lock:
            replies = list(self._reader.by_key.get(answer.operation_key, []))
        later = [
            d
            for d in replies
            if d.partition == answer.partition
            and d.operation_key == answer.operation_key
            and d.offset > answer.offset
            and not d.decision_id.startswith("r/")
        ]
        return later[-1] if later else answer

    def wait_settled(
        self,
        operation_key: str,
        *,
        epoch: Optional[int] = None,
        final: bool = False,
        timeout: float = 300.0,
    ) -> Settlement:
        """Waits for how the effect of ``operation_key`` ended (of attempt ``epoch`` when
        given, else its latest): COMMITTED, FAILED, EXPIRED or CANCELLED, or UNKNOWN (not
        ``final``: reconciliation is under way, do not retry) unless ``final`` asks to wait
        past it. Returns at once when it is known already."""
        deadline = time.monotonic() + timeout
        partition = self.partition(operation_key)
        self._reader.follow(self.decisions, partition, _left(deadline))
        self._reader.follow(self.outcomes, partition, _left(deadline))
        wanted = FINAL if final else SETTLING

        def wants(d: Decision) -> bool:
            return (
                d.operation_key == operation_key
                and d.verdict in wanted
                and (epoch is None or d.epoch == epoch)
            )

        def known() -> Optional[Decision]:
            for d in reversed(self._reader.by_key.get(operation_key, [])):
                if wants(d):
                    return d
            return None

        waiter = _Waiter(self.decisions, partition, wants)
        decision = self._await(
            self._reader.wait(waiter, known), waiter, deadline, f"the outcome of {operation_key}"
        )
        result = None
        if decision.epoch is not None and decision.verdict in ("COMMITTED", "FAILED"):
            # The connector's outcome precedes the decision on the topics, but the reader may
            # meet the two partitions in either order: give the outcome a moment.
            until = min(deadline, time.monotonic() + 5.0)
            while True:
                with self._reader.lock:
                    result = self._reader.evidence.get(
                        (operation_key, decision.epoch, decision.verdict)
                    )
                if result is not None or time.monotonic() >= until:
                    break
                time.sleep(0.05)
        return Settlement(decision=decision, final=decision.verdict in FINAL, result=result)

    def _await(self, future: Future, waiter: _Waiter, deadline: float, what: str) -> Decision:
        try:
            return future.result(timeout=_left(deadline))
        except FutureTimeout:
            with self._reader.lock:
                unreadable = self._reader.unreadable.get((waiter.topic, waiter.partition))
            hint = (
                f"; decisions on {waiter.topic} partition {waiter.partition} this client cannot "
                f"read (a newer Airlock? upgrade the client): {unreadable}"
                if unreadable
                else " (is `airlock run` up?)"
            )
            raise TimedOut(
                f"no answer for {what} in time{hint}; sending the same proposal again is safe"
            ) from None
        finally:
            self._reader.forget(waiter)

    def _produce(self, topic: str, partition: int, key: str, payload: bytes, deadline: float) -> None:
        delivered: Future = Future()

        def report(err: Optional[KafkaError], _msg: Any) -> None:
            if err is None:
                delivered.set_result(None)
            else:
                delivered.set_exception(BrokerUnavailable(f"producing to {topic}: {err}"))

        try:
            self._producer.produce(
                topic, value=payload, key=key.encode("utf-8"), partition=partition, on_delivery=report
            )
        except (KafkaException, BufferError) as e:
            raise BrokerUnavailable(f"producing to {topic}: {e}") from None
        while not delivered.done():
            if time.monotonic() >= deadline:
                raise BrokerUnavailable(f"producing to {topic}: not acknowledged in time")
            self._producer.poll(0.05)
        delivered.result()


def _left(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())

//! What a worker writes: outcomes (to `<prefix>outcomes`, the partition of the command, keyed
//! by operation key) and dead letters (to `<prefix>dlq`), each with a deterministic identity
//! so that a record written again after a crash is recognised as the same.
//!
//! Outcome ids: `outcome/<connector>/<operation key>#<epoch>/<KIND>` for a dispatch,
//! `outcome/<connector>/<operation key>#<epoch>/r<round>/<KIND>` for a reconcile round.
//! Headers: `wire::identity("outcome", id, partition, owner epoch of the command)`.
//!
//! Dead letters carry the processor's DLQ headers (`airlock-dlq-reason`, `-detail`,
//! `airlock-source-topic`, `-partition`, `-offset`), the original key and bytes, and no owner
//! epoch: a worker owns no partition, and the processor's fence markers on the DLQ must not
//! hide what a worker refused.

use airlock_processor::runtime::topics::Names;
use airlock_processor::runtime::wire::{self, OutRecord, header};
use airlock_schemas::{Codec, Outcome, OutcomeKind};

use crate::http::{Observation, Proof};

/// The header naming the worker that wrote a dead letter.
pub const WORKER_HEADER: &str = "airlock-connector-worker";

/// Who reports, and where.
#[derive(Clone, Debug)]
pub struct Reporter {
    pub names: Names,
    pub connector: String,
    pub worker_id: String,
    pub codec: Codec,
    /// Signs every outcome (`capability::sign_outcome`), when configured.
    pub signing_key: Option<std::sync::Arc<airlock_processor::capability::SigningKey>>,
}

/// The attempt an outcome is about.
#[derive(Clone, Copy, Debug)]
pub struct Attempt<'a> {
    pub operation_key: &'a str,
    pub epoch: i64,
    pub partition: i32,
    pub owner_epoch: i64,
    /// The reconcile round answered; `None` for a dispatch.
    pub round: Option<i32>,
}

impl Reporter {
    /// The outcome of `attempt` and its record.
    pub fn outcome(
        &self,
        attempt: Attempt<'_>,
        kind: OutcomeKind,
        evidence: Option<String>,
        provider_reference: Option<String>,
        observed_at: i64,
    ) -> (Outcome, OutRecord) {
        let round = attempt.round.map(|r| format!("r{r}/")).unwrap_or_default();
        let outcome_id = format!(
            "outcome/{}/{}#{}/{round}{}",
            self.connector,
            attempt.operation_key,
            attempt.epoch,
            kind.as_str()
        );
        let outcome = Outcome {
            outcome_id: outcome_id.clone(),
            operation_key: attempt.operation_key.to_owned(),
            epoch: attempt.epoch,
            kind,
            connector: self.connector.clone(),
            worker_id: self.worker_id.clone(),
            evidence,
            provider_reference,
            reconcile_round: attempt.round,
            observed_at,
        };
        let value = self
            .codec
            .encode_single_object(&outcome)
            .expect("an Outcome built here always encodes");
        let mut headers = wire::identity(
            "outcome",
            &outcome_id,
            attempt.partition,
            attempt.owner_epoch,
        );
        if let Some(key) = &self.signing_key {
            headers.push((
                wire::header::CAPABILITY.to_owned(),
                airlock_processor::capability::sign_outcome(key, &self.connector, &value),
            ));
        }
        let record = OutRecord {
            topic: self.names.outcomes(),
            partition: attempt.partition,
            key: Some(attempt.operation_key.as_bytes().to_vec()),
            value: Some(value),
            headers,
            phase: 0,
        };
        (outcome, record)
    }

    /// A dead letter for the record at `offset` of `topic`'s `partition`.
    pub fn dead_letter(&self, source: Source<'_>, reason: &str, detail: &str) -> OutRecord {
        let id = format!(
            "dlq/{}/{}/{}",
            source.topic, source.partition, source.offset
        );
        let mut headers: Vec<(String, Vec<u8>)> = wire::identity("dlq", &id, source.partition, 0)
            .into_iter()
            .filter(|(k, _)| k != header::OWNER_EPOCH)
            .collect();
        headers.extend([
            (header::DLQ_REASON.to_owned(), reason.as_bytes().to_vec()),
            (header::DLQ_DETAIL.to_owned(), detail.as_bytes().to_vec()),
            (
                header::SOURCE_TOPIC.to_owned(),
                source.topic.as_bytes().to_vec(),
            ),
            (
                header::SOURCE_PARTITION.to_owned(),
                source.partition.to_string().into_bytes(),
            ),
            (
                header::SOURCE_OFFSET.to_owned(),
                source.offset.to_string().into_bytes(),
            ),
            (WORKER_HEADER.to_owned(), self.worker_id.as_bytes().to_vec()),
        ]);
        OutRecord {
            topic: self.names.dlq(),
            partition: source.partition,
            key: source.key.map(<[u8]>::to_vec),
            value: source.payload.map(<[u8]>::to_vec),
            headers,
            phase: 0,
        }
    }
}

/// Where a dead-lettered record was read, and its bytes.
#[derive(Clone, Copy, Debug)]
pub struct Source<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<&'a [u8]>,
    pub payload: Option<&'a [u8]>,
}

/// The outcome kind of an observation: of a call, or of a reconcile lookup.
pub fn kind_of(observation: &Observation, reconcile: bool) -> OutcomeKind {
    match (observation.proof, reconcile) {
        (Proof::Committed, false) => OutcomeKind::Committed,
        (Proof::Failed, false) => OutcomeKind::Failed,
        (Proof::Unknown, false) => OutcomeKind::Unknown,
        (Proof::Committed, true) => OutcomeKind::ReconciledCommitted,
        (Proof::Failed, true) => OutcomeKind::ReconciledFailed,
        (Proof::Unknown, true) => OutcomeKind::ReconciledUnknown,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use airlock_processor::runtime::wire::{Admit, FenceFilter};

    use super::*;

    fn reporter() -> Reporter {
        Reporter {
            names: Names::new("airlock."),
            connector: "ledger".into(),
            worker_id: "w1".into(),
            codec: Codec::new(),
            signing_key: None,
        }
    }

    #[test]
    fn outcomes_have_deterministic_ids_and_go_to_the_commands_partition() {
        let attempt = Attempt {
            operation_key: "refund:txn_1",
            epoch: 2,
            partition: 4,
            owner_epoch: 3,
            round: Some(1),
        };
        let (o, r) = reporter().outcome(
            attempt,
            OutcomeKind::ReconciledCommitted,
            Some("HTTP 200".into()),
            Some("eff_1".into()),
            5,
        );
        assert_eq!(
            o.outcome_id,
            "outcome/ledger/refund:txn_1#2/r1/RECONCILED_COMMITTED"
        );
        assert_eq!(o.reconcile_round, Some(1));
        assert_eq!((r.topic.as_str(), r.partition), ("airlock.outcomes", 4));
        assert_eq!(r.key.as_deref(), Some(&b"refund:txn_1"[..]));
        let decoded: Outcome = Codec::new().decode_as(r.value.as_deref().unwrap()).unwrap();
        assert_eq!(decoded, o);
        assert_eq!(r.header(header::ID), Some(o.outcome_id.as_bytes()));
    }

    #[test]
    fn a_dead_letter_is_never_hidden_by_the_processors_fence() {
        let dl = reporter().dead_letter(
            Source {
                topic: "airlock.dispatch.ledger",
                partition: 1,
                offset: 42,
                key: Some(b"k"),
                payload: Some(b"v"),
            },
            "FORGED",
            "not signed",
        );
        assert_eq!(dl.header(header::DLQ_REASON), Some(&b"FORGED"[..]));
        assert_eq!(dl.header(header::SOURCE_OFFSET), Some(&b"42"[..]));
        let mut filter = FenceFilter::default();
        let marker = OutRecord::fence_marker("airlock.dlq", 1, 9);
        let hs = |r: &OutRecord| {
            r.headers
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<Vec<_>>()
        };
        let m = hs(&marker);
        filter.admit(
            "airlock.dlq",
            1,
            m.iter().map(|(k, v)| (k.as_str(), v.as_slice())),
        );
        let d = hs(&dl);
        assert_eq!(
            filter.admit(
                "airlock.dlq",
                1,
                d.iter().map(|(k, v)| (k.as_str(), v.as_slice()))
            ),
            Admit::Accept
        );
    }
}

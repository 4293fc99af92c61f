//! State as a projection of the journal: every state change the core makes travels in a journal
//! event (`record_json`, the list of [`Write`]s), so applying the journal in order rebuilds the
//! state, and the projection hash of the rebuilt state must equal the live task's.

use std::borrow::Cow;

use airlock_schemas::JournalEvent;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::record::{REDUCER_VERSION, TimerFields, Write};

/// Errors of the reducer: a journal it cannot apply.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "journal event {partition}/{sequence} was written by reducer version {found}; this build reads up to {REDUCER_VERSION}"
    )]
    NewerReducer {
        partition: i32,
        sequence: i64,
        found: i32,
    },
    #[error("journal event {partition}/{sequence} has an undecodable record_json: {source}")]
    Corrupt {
        partition: i32,
        sequence: i64,
        #[source]
        source: serde_json::Error,
    },
}

/// The state writes one journal event carries, in order.
pub fn writes_of(event: &JournalEvent) -> Result<Vec<Write>, Error> {
    parse(event, serde_json::from_str)
}

/// Which table a [`RawWrite`] lands in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Row {
    Effect,
    Proposal,
    Run,
}

/// One state write as the journal carries it, its record left as JSON text. The store holds a
/// record as the same serializer's output for the same value, so this text is, byte for byte,
/// the row the live task stored: a replay hashes it without decoding the record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawWrite<'a> {
    pub row: Row,
    /// The row's id: operation key, proposal id or run id.
    pub id: Cow<'a, str>,
    /// `None` deletes the row.
    pub record: Option<RawRecord<'a>>,
}

/// A written record's JSON and the due time of its timer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawRecord<'a> {
    pub json: &'a str,
    pub timer: Option<i64>,
}

/// The state writes one journal event carries, in order, without decoding their records beyond
/// the fields their timers are computed from ([`TimerFields`]).
pub fn raw_writes_of(event: &JournalEvent) -> Result<Vec<RawWrite<'_>>, Error> {
    parse(event, |json| {
        let writes: Vec<Framed<'_>> = serde_json::from_str(json)?;
        writes.into_iter().map(Framed::raw).collect()
    })
}

/// [`Write`]'s JSON framing with its records left unparsed.
#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum Framed<'a> {
    Effect {
        #[serde(borrow)]
        key: Cow<'a, str>,
        #[serde(borrow)]
        record: Option<&'a RawValue>,
    },
    Proposal {
        #[serde(borrow)]
        id: Cow<'a, str>,
        #[serde(borrow)]
        seen: Option<&'a RawValue>,
    },
    Run {
        #[serde(borrow)]
        run_id: Cow<'a, str>,
        #[serde(borrow)]
        run: Option<&'a RawValue>,
    },
}

/// What a proposal's or a run's timer depends on.
#[derive(Deserialize)]
struct Expiry {
    expires_at: i64,
}

impl<'a> Framed<'a> {
    fn raw(self) -> serde_json::Result<RawWrite<'a>> {
        let (row, id, record) = match self {
            Framed::Effect { key, record } => (Row::Effect, key, record),
            Framed::Proposal { id, seen } => (Row::Proposal, id, seen),
            Framed::Run { run_id, run } => (Row::Run, run_id, run),
        };
        let record = match record {
            None => None,
            Some(raw) => {
                let json = raw.get();
                let timer = match row {
                    Row::Effect => serde_json::from_str::<TimerFields>(json)?
                        .next_timer()
                        .map_err(|field| {
                            serde::de::Error::custom(format!(
                                "the effect record of {id:?} lacks {field} for its state"
                            ))
                        })?
                        .map(|(due, _)| due),
                    Row::Proposal | Row::Run => {
                        Some(serde_json::from_str::<Expiry>(json)?.expires_at)
                    }
                };
                Some(RawRecord { json, timer })
            }
        };
        Ok(RawWrite { row, id, record })
    }
}

fn parse<'a, T>(
    event: &'a JournalEvent,
    read: impl FnOnce(&'a str) -> serde_json::Result<Vec<T>>,
) -> Result<Vec<T>, Error> {
    if event.reducer_version > REDUCER_VERSION {
        return Err(Error::NewerReducer {
            partition: event.partition,
            sequence: event.sequence,
            found: event.reducer_version,
        });
    }
    match &event.record_json {
        None => Ok(Vec::new()),
        Some(json) => read(json).map_err(|source| Error::Corrupt {
            partition: event.partition,
            sequence: event.sequence,
            source,
        }),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use airlock_schemas::{JournalKind, Reason, Verdict};

    use super::*;
    use crate::audit::replay;
    use crate::core::record::{EffectRecord, ProposalSeen, RunRecord, State};
    use crate::sample;

    /// A record whose strings need escaping in JSON, and non-ASCII text the serializer keeps.
    fn record(key: &str, state: State) -> EffectRecord {
        let mut r = sample::effect_record(key, state);
        r.principal_id = "agent \"support\" 1".into();
        r.arguments_json = r#"{"note":"café ☕","amount":1}"#.into();
        r.used_approvals = vec!["a1".into()];
        r.applied_controls = vec!["c1".into()];
        r
    }

    fn every_state() -> Vec<State> {
        vec![
            State::AwaitingApproval {
                expires_at: 20_000,
                approvals: vec![("a1".into(), "alice".into())],
            },
            State::AwaitingApproval {
                expires_at: 5_000,
                approvals: vec![],
            },
            State::Dispatched {
                attempt_deadline_at: 100,
                timeout_at: 150,
            },
            State::InFlight {
                attempt_deadline_at: 100,
                timeout_at: 150,
                started_at: 90,
            },
            State::Unknown {
                since: 1,
                rounds: 2,
                next_reconcile_at: 300,
            },
            State::OperatorRequired {
                since: 1,
                rounds: 5,
                may_land_until: 0,
            },
            State::Failed {
                evidence: "declined".into(),
                settled_at: 400,
                retry_at: Some(450),
            },
            State::Failed {
                evidence: "declined".into(),
                settled_at: 400,
                retry_at: None,
            },
            State::Committed {
                receipt: "r".into(),
                evidence: "ledger \\ tx".into(),
                settled_at: 500,
            },
            State::Expired { at: 600 },
            State::Denied {
                at: 700,
                by: "bob".into(),
            },
            State::Cancelled {
                at: 800,
                by: "ops".into(),
            },
        ]
    }

    /// A journal event carrying `writes` as the core journals them.
    fn event(writes: &[Write]) -> JournalEvent {
        let mut e = replay::tests::event(0, JournalKind::ProposalDecided, "k", 0, None);
        e.record_json = Some(serde_json::to_string(writes).unwrap());
        e
    }

    /// Each raw write is the decoded write's record serialized on its own, with its timer:
    /// the bytes the store held and the timer the store indexed, for every state.
    #[test]
    fn raw_writes_are_the_stored_records_with_their_timers() {
        let mut writes: Vec<Write> = every_state()
            .into_iter()
            .enumerate()
            .map(|(i, state)| Write::Effect {
                key: format!("refund:\"{i}\""),
                record: Some(Box::new(record(&format!("k{i}"), state))),
            })
            .collect();
        writes.push(Write::Effect {
            key: "gone".into(),
            record: None,
        });
        writes.push(Write::Proposal {
            id: "p-1".into(),
            seen: Some(ProposalSeen {
                operation_key: "k".into(),
                decision_id: "d".into(),
                verdict: Verdict::Accepted,
                reason: Reason::AutoApproved,
                detail: String::new(),
                arguments_hash: None,
                policy_bundle_hash: None,
                decided_at: 1,
                expires_at: 9_000,
                fingerprint: None,
            }),
        });
        writes.push(Write::Run {
            run_id: "run-1".into(),
            run: Some(RunRecord {
                highest_fence: 3,
                dispatches: 1,
                updated_at: 1,
                expires_at: 7_000,
            }),
        });
        writes.push(Write::Run {
            run_id: "run-2".into(),
            run: None,
        });
        let e = event(&writes);
        let raw = raw_writes_of(&e).unwrap();
        assert_eq!(raw.len(), writes.len());
        for (w, r) in writes.iter().zip(&raw) {
            let (row, id, json) = match w {
                Write::Effect { key, record } => (
                    Row::Effect,
                    key,
                    record.as_ref().map(|r| serde_json::to_string(r).unwrap()),
                ),
                Write::Proposal { id, seen } => (
                    Row::Proposal,
                    id,
                    seen.as_ref().map(|s| serde_json::to_string(s).unwrap()),
                ),
                Write::Run { run_id, run } => (
                    Row::Run,
                    run_id,
                    run.as_ref().map(|r| serde_json::to_string(r).unwrap()),
                ),
            };
            assert_eq!(r.row, row);
            assert_eq!(r.id, id.as_str());
            assert_eq!(r.record.map(|r| r.json), json.as_deref());
            assert_eq!(
                r.record.and_then(|r| r.timer),
                w.timer().map(|t| t.due_at),
                "{w:?}"
            );
        }
    }

    #[test]
    fn a_record_missing_its_state_time_is_corrupt() {
        let json = r#"[{"effect":{"key":"k","record":{"deadline_at":1,"retention_ms":1,"state":{"kind":"DISPATCHED"}}}}]"#;
        let mut e = event(&[]);
        e.record_json = Some(json.to_owned());
        let err = raw_writes_of(&e).unwrap_err().to_string();
        assert!(err.contains("lacks timeout_at"), "{err}");
    }
}

//! The state the core keeps, as plain data: one [`EffectRecord`] per operation key, one
//! [`ProposalSeen`] per proposal id (producer-resend dedup), one [`RunRecord`] per agent run
//! (lease fence and dispatch budget).
//!
//! Every record knows its own next timer ([`EffectRecord::next_timer`] and friends), so the timer
//! index is a projection of the records and is rebuilt with them: a replay never reads a clock.
//!
//! These types are serialized (JSON, behind a version byte) into the state store, into the
//! changelog and into `JournalEvent.record_json`. Changing their shape is a reducer version bump.

use airlock_schemas::{EffectState, Reason, Verdict};
use serde::{Deserialize, Serialize};

/// Version of the record shapes and of the reducer that applies journal deltas. Bump it when a
/// record gains or loses a field; replays refuse journals written by a newer reducer.
/// 2: `EffectRecord.closed_until` (closed-intent markers).
pub const REDUCER_VERSION: i32 = 2;

/// Everything Airlock knows about one business intent (one operation key).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EffectRecord {
    pub operation_key: String,
    pub tenant_id: String,
    /// The requester of the current attempt: the principal whose proposal created the intent,
    /// or proposed its latest retry. Never its own approver, and the dispatch carries it.
    pub principal_id: String,
    /// Every earlier requester of the intent (proposers of attempts before the current one):
    /// none of them may approve it either, so a second principal cannot propose the retry of
    /// another's intent and approve it. Absent from the JSON while empty, so rows written
    /// before it existed read and hash the same.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub earlier_requesters: Vec<String>,
    pub run_id: String,
    /// The proposal that created the intent; approvals and settlements reply to it.
    pub proposal_id: String,
    pub tool: String,
    pub tool_version: String,
    pub connector: String,
    /// Canonical JSON; what the connector executes, byte for byte.
    pub arguments_json: String,
    /// Binds key, approvals and dispatches to the exact arguments.
    pub arguments_hash: String,
    pub idempotency_key: String,
    pub lease_fence: i64,
    /// Absolute deadline of the whole intent, fixed by the first proposal.
    pub deadline_at: i64,
    pub created_at: i64,
    /// Bundle under which the latest authorization was evaluated.
    pub policy_bundle_hash: String,
    /// Epoch of the latest dispatch; 0 before the first one. Outcomes for other epochs are stale.
    pub epoch: i64,
    /// Dispatches so far (the attempt ceiling counts these).
    pub attempts: u32,
    /// Every approval id ever counted for this key: approvals are single use.
    pub used_approvals: Vec<String>,
    /// Every operator control (settle, cancel) applied to this intent, by control id: a control
    /// applies once, and a repeat of its id is answered DUPLICATE and changes nothing. Absent
    /// from the JSON while empty, so rows written before it existed read and hash the same.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub applied_controls: Vec<String>,
    /// Copied from the tool at creation so that purging does not depend on today's registry.
    pub retention_ms: u64,
    /// Set once the record's retention has passed: its bulk (arguments, approvals, evidence) is
    /// gone and what is left is a closed-intent marker that keeps answering blind retries of
    /// the key (a committed intent with its receipt) until this time, then is deleted. See
    /// [`EffectRecord::close`]. Absent from the JSON until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed_until: Option<i64>,
    pub state: State,
    pub updated_at: i64,
}

/// The effect state machine of DESIGN.md section 3. Terminal variants are sinks: no transition
/// leaves them except purging after retention.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum State {
    /// Authorized at the approval tier; waits for `quorum` distinct approvers.
    AwaitingApproval {
        expires_at: i64,
        /// `(approval_id, approver_id)` counted towards the quorum in this round.
        approvals: Vec<(String, String)>,
    },
    /// A dispatch intent is durable and the command left; no attempt has been reported yet.
    Dispatched {
        /// The command's capability expires here; no connector may start it later.
        attempt_deadline_at: i64,
        /// `attempt_deadline_at` plus the outcome grace: without an outcome by then, UNKNOWN.
        timeout_at: i64,
    },
    /// A connector recorded AttemptStarted for the current epoch.
    InFlight {
        attempt_deadline_at: i64,
        timeout_at: i64,
        started_at: i64,
    },
    /// Nobody can prove what happened. Held, never guessed FAILED; reconciled by rounds.
    Unknown {
        since: i64,
        /// Reconcile rounds sent so far.
        rounds: u32,
        next_reconcile_at: i64,
    },
    /// The reconciliation budget is spent (or the tool is not reconcilable): an operator settles.
    OperatorRequired {
        since: i64,
        rounds: u32,
        /// Until then the call may still take effect (its command's expiry), so it cannot be
        /// settled FAILED yet. Absent (0) when reconciliation ran, and in rows written before
        /// it existed.
        #[serde(default, skip_serializing_if = "is_zero")]
        may_land_until: i64,
    },
    /// Proof that the latest attempt did not happen. `retry_at` is set while the retry policy
    /// still allows another epoch; without it the failure is final.
    Failed {
        evidence: String,
        settled_at: i64,
        retry_at: Option<i64>,
    },
    /// Terminal: proof of exactly one effect.
    Committed {
        receipt: String,
        evidence: String,
        settled_at: i64,
    },
    /// Terminal: the approval request or the deadline lapsed before anything was dispatched.
    Expired { at: i64 },
    /// Terminal: an approver rejected, or authorization re-evaluated at approval time denied.
    Denied { at: i64, by: String },
    /// Terminal: an operator cancelled before dispatch.
    Cancelled { at: i64, by: String },
}

/// What fires when a record's timer is due; derived from the state, never stored on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimerKind {
    ApprovalExpiry,
    AttemptTimeout,
    Reconcile,
    Retry,
    Purge,
}

/// The fields of an [`EffectRecord`] its timer depends on. [`EffectRecord::next_timer`]
/// computes the timer from them, and a replay deserializes only them from a record's JSON
/// (unknown fields are skipped), so both read the timer through the same code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub struct TimerFields {
    pub deadline_at: i64,
    pub retention_ms: u64,
    #[serde(default)]
    pub closed_until: Option<i64>,
    pub state: StateTimes,
}

/// The state's kind and the times its variants carry, by their field names in [`State`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub struct StateTimes {
    pub kind: EffectState,
    pub expires_at: Option<i64>,
    pub timeout_at: Option<i64>,
    pub next_reconcile_at: Option<i64>,
    pub retry_at: Option<i64>,
    pub settled_at: Option<i64>,
    pub at: Option<i64>,
}

impl TimerFields {
    /// The single timer a record with these fields waits for, if any; `Err` names a time its
    /// state must carry and does not (a corrupt record).
    pub fn next_timer(&self) -> Result<Option<(i64, TimerKind)>, &'static str> {
        let s = &self.state;
        // A terminal record is purged twice: its bulk after its retention (it becomes a
        // closed-intent marker), the marker itself at `closed_until`.
        let purge = |at: i64| {
            Some(match self.closed_until {
                Some(until) => (until, TimerKind::Purge),
                None => (
                    at.saturating_add_unsigned(self.retention_ms),
                    TimerKind::Purge,
                ),
            })
        };
        Ok(match s.kind {
            EffectState::AwaitingApproval => Some((
                s.expires_at.ok_or("expires_at")?.min(self.deadline_at),
                TimerKind::ApprovalExpiry,
            )),
            EffectState::Dispatched | EffectState::InFlight => {
                Some((s.timeout_at.ok_or("timeout_at")?, TimerKind::AttemptTimeout))
            }
            EffectState::Unknown => Some((
                s.next_reconcile_at.ok_or("next_reconcile_at")?,
                TimerKind::Reconcile,
            )),
            EffectState::OperatorRequired => None,
            EffectState::Failed => match s.retry_at {
                Some(at) => Some((at, TimerKind::Retry)),
                None => purge(s.settled_at.ok_or("settled_at")?),
            },
            EffectState::Committed => purge(s.settled_at.ok_or("settled_at")?),
            EffectState::Expired | EffectState::Denied | EffectState::Cancelled => {
                purge(s.at.ok_or("at")?)
            }
        })
    }
}

impl EffectRecord {
    /// The single timer this record waits for, if any.
    pub fn next_timer(&self) -> Option<(i64, TimerKind)> {
        TimerFields {
            deadline_at: self.deadline_at,
            retention_ms: self.retention_ms,
            closed_until: self.closed_until,
            state: self.state.times(),
        }
        .next_timer()
        .expect("a typed state carries every time its timer needs")
    }

    /// The Avro-facing name of the state.
    pub fn effect_state(&self) -> EffectState {
        self.state.effect_state()
    }

    /// Turns a terminal record whose retention has passed into a closed-intent marker kept
    /// until `until`: it keeps what binds the key (tool, version, tenant, arguments hash), the
    /// state, the epoch, a commit's receipt and the small identifiers (principal, run,
    /// proposal, idempotency key, who denied or cancelled), and drops the bulk: the canonical
    /// arguments (up to the tool's size limit), the approvals and controls counted, the
    /// evidence. A blind retry of the key is
    /// still answered as the intent's (DUPLICATE with the receipt, or closed), never decided
    /// afresh as a new intent at epoch 1.
    pub fn close(&mut self, until: i64) {
        self.closed_until = Some(until);
        self.arguments_json = String::new();
        self.used_approvals = Vec::new();
        self.applied_controls = Vec::new();
        self.earlier_requesters = Vec::new();
        match &mut self.state {
            State::Committed { evidence, .. } | State::Failed { evidence, .. } => {
                *evidence = String::new();
            }
            _ => {}
        }
    }

    /// True once nothing but purging can change the record.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self.state,
            State::Committed { .. }
                | State::Failed { retry_at: None, .. }
                | State::Expired { .. }
                | State::Denied { .. }
                | State::Cancelled { .. }
        )
    }
}

impl State {
    /// The times of this state its timer is computed from.
    fn times(&self) -> StateTimes {
        let mut t = StateTimes {
            kind: self.effect_state(),
            expires_at: None,
            timeout_at: None,
            next_reconcile_at: None,
            retry_at: None,
            settled_at: None,
            at: None,
        };
        match *self {
            State::AwaitingApproval { expires_at, .. } => t.expires_at = Some(expires_at),
            State::Dispatched { timeout_at, .. } | State::InFlight { timeout_at, .. } => {
                t.timeout_at = Some(timeout_at);
            }
            State::Unknown {
                next_reconcile_at, ..
            } => t.next_reconcile_at = Some(next_reconcile_at),
            State::OperatorRequired { .. } => {}
            State::Failed {
                settled_at,
                retry_at,
                ..
            } => {
                t.settled_at = Some(settled_at);
                t.retry_at = retry_at;
            }
            State::Committed { settled_at, .. } => t.settled_at = Some(settled_at),
            State::Expired { at } | State::Denied { at, .. } | State::Cancelled { at, .. } => {
                t.at = Some(at);
            }
        }
        t
    }

    pub fn effect_state(&self) -> EffectState {
        match self {
            State::AwaitingApproval { .. } => EffectState::AwaitingApproval,
            State::Dispatched { .. } => EffectState::Dispatched,
            State::InFlight { .. } => EffectState::InFlight,
            State::Unknown { .. } => EffectState::Unknown,
            State::OperatorRequired { .. } => EffectState::OperatorRequired,
            State::Failed { .. } => EffectState::Failed,
            State::Committed { .. } => EffectState::Committed,
            State::Expired { .. } => EffectState::Expired,
            State::Denied { .. } => EffectState::Denied,
            State::Cancelled { .. } => EffectState::Cancelled,
        }
    }
}

/// The reply a proposal id already received, so a producer-side resend gets the same answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProposalSeen {
    pub operation_key: String,
    pub decision_id: String,
    pub verdict: Verdict,
    pub reason: Reason,
    pub detail: String,
    pub arguments_hash: Option<String>,
    pub policy_bundle_hash: Option<String>,
    pub decided_at: i64,
    /// Purged then: resends older than the dedup retention are decided afresh (and meet the
    /// effect record, which is retained longer).
    pub expires_at: i64,
    /// What the proposal said (see `machine::proposal_fingerprint`): only a proposal that says
    /// the same gets this reply again. Absent in rows written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
}

/// Per agent run, per partition: the lease fence and the dispatch budget.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    /// Highest accepted lease fence; proposals below it are STALE_FENCE.
    pub highest_fence: i64,
    /// Dispatches this run caused on this partition (bounded by `max_dispatches_per_run`).
    pub dispatches: u32,
    pub updated_at: i64,
    /// Purged after this much inactivity.
    pub expires_at: i64,
}

/// Which record a timer belongs to.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimerTarget {
    Effect(String),
    Proposal(String),
    Run(String),
}

/// A timer that came due; fed back to the core as an input. `due_at` is also its `now`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TimerFired {
    pub due_at: i64,
    pub target: TimerTarget,
}

/// One state change. The journal carries these (as `record_json`) so the projection can be
/// rebuilt from the journal alone; `None` deletes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Write {
    Effect {
        key: String,
        record: Option<Box<EffectRecord>>,
    },
    Proposal {
        id: String,
        seen: Option<ProposalSeen>,
    },
    Run {
        run_id: String,
        run: Option<RunRecord>,
    },
}

impl Write {
    /// The written record as JSON, `None` for a delete: the bytes the store holds for the row and
    /// the journal carries for it (see [`Write::journal_json`]).
    pub fn record_json(&self) -> serde_json::Result<Option<String>> {
        match self {
            Write::Effect { record, .. } => record.as_deref().map(serde_json::to_string),
            Write::Proposal { seen, .. } => seen.as_ref().map(serde_json::to_string),
            Write::Run { run, .. } => run.as_ref().map(serde_json::to_string),
        }
        .transpose()
    }

    /// `serde_json::to_string(writes)`, the journal's `record_json`, put together from the
    /// records' JSON already made by [`Write::record_json`] (`rows`, one per write), so that
    /// each record is serialized once for the journal and the store.
    pub fn journal_json(writes: &[Write], rows: &[Option<String>]) -> serde_json::Result<String> {
        debug_assert_eq!(writes.len(), rows.len(), "one row per write");
        let mut out = Vec::with_capacity(
            rows.iter()
                .map(|r| r.as_ref().map_or(4, String::len) + 48)
                .sum::<usize>()
                + 2,
        );
        out.push(b'[');
        for (i, (write, row)) in writes.iter().zip(rows).enumerate() {
            if i > 0 {
                out.push(b',');
            }
            // Serde's externally tagged form of `Write`: {"<variant>":{"<id>":..,"<record>":..}}.
            let (head, id, field) = match write {
                Write::Effect { key, .. } => {
                    (&b"{\"effect\":{\"key\":"[..], key, &b",\"record\":"[..])
                }
                Write::Proposal { id, .. } => {
                    (&b"{\"proposal\":{\"id\":"[..], id, &b",\"seen\":"[..])
                }
                Write::Run { run_id, .. } => {
                    (&b"{\"run\":{\"run_id\":"[..], run_id, &b",\"run\":"[..])
                }
            };
            out.extend_from_slice(head);
            serde_json::to_writer(&mut out, id)?;
            out.extend_from_slice(field);
            out.extend_from_slice(row.as_deref().unwrap_or("null").as_bytes());
            out.extend_from_slice(b"}}");
        }
        out.push(b']');
        Ok(String::from_utf8(out).expect("JSON text and UTF-8 strings make UTF-8"))
    }

    /// The timer the written value waits for (none for a delete).
    pub fn timer(&self) -> Option<TimerFired> {
        match self {
            Write::Effect {
                key,
                record: Some(r),
            } => r.next_timer().map(|(due_at, _)| TimerFired {
                due_at,
                target: TimerTarget::Effect(key.clone()),
            }),
            Write::Proposal { id, seen: Some(s) } => Some(TimerFired {
                due_at: s.expires_at,
                target: TimerTarget::Proposal(id.clone()),
            }),
            Write::Run {
                run_id,
                run: Some(r),
            } => Some(TimerFired {
                due_at: r.expires_at,
                target: TimerTarget::Run(run_id.clone()),
            }),
            _ => None,
        }
    }
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use airlock_schemas::{Reason, Verdict};

    use super::*;
    use crate::sample;

    #[test]
    fn journal_json_is_serdes_text_of_the_writes() {
        let seen = ProposalSeen {
            operation_key: "k".into(),
            decision_id: "p/é\"\\".into(),
            verdict: Verdict::Accepted,
            reason: Reason::AutoApproved,
            detail: "line\nbreak".into(),
            arguments_hash: None,
            policy_bundle_hash: Some("ab".into()),
            decided_at: 1,
            expires_at: 2,
            fingerprint: None,
        };
        let run = RunRecord {
            highest_fence: 3,
            dispatches: 4,
            updated_at: 5,
            expires_at: 6,
        };
        let effect = sample::effect_record(
            "refund:\"quoted\"/ключ",
            State::Failed {
                evidence: "declined".into(),
                settled_at: 7,
                retry_at: Some(8),
            },
        );
        let cases: Vec<Vec<Write>> = vec![
            vec![],
            vec![Write::Effect {
                key: effect.operation_key.clone(),
                record: Some(Box::new(effect.clone())),
            }],
            vec![
                Write::Proposal {
                    id: "p\u{1}\u{7f}".into(),
                    seen: Some(seen),
                },
                Write::Run {
                    run_id: "run-1".into(),
                    run: Some(run),
                },
                Write::Effect {
                    key: "gone".into(),
                    record: None,
                },
                Write::Proposal {
                    id: "old".into(),
                    seen: None,
                },
                Write::Run {
                    run_id: "stale".into(),
                    run: None,
                },
            ],
        ];
        for writes in cases {
            let rows: Vec<Option<String>> = writes
                .iter()
                .map(|w| w.record_json().expect("records serialize"))
                .collect();
            assert_eq!(
                Write::journal_json(&writes, &rows).expect("writes serialize"),
                serde_json::to_string(&writes).expect("writes serialize"),
            );
        }
    }
}

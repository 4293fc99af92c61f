//! What the core reacts to. Each input is a fact that already happened and is on a topic (or,
//! for timers, journaled), so re-deciding it after a crash gives the same outputs.

use airlock_schemas::{Approval, Control, Outcome, ToolProposal};

pub use super::record::{TimerFired, TimerTarget};

/// One input to [`super::Core::handle`].
#[derive(Clone, Debug)]
pub enum Input {
    /// An agent asks for a tool call (`airlock.proposals`).
    Proposal(ToolProposal),
    /// A human approves or rejects a pending intent (`airlock.approvals`).
    Approval(Approval),
    /// A connector reports an attempt or a reconciliation (`airlock.outcomes`).
    Outcome(Outcome),
    /// An operator settles, cancels or fences (`airlock.control`).
    Control(Control),
    /// A record's own timer came due (from the store's timer index).
    Timer(TimerFired),
}

impl Input {
    /// The identity of the input, recorded as the journal's `cause_id`.
    pub fn cause_id(&self) -> String {
        match self {
            Input::Proposal(p) => format!("proposal:{}", p.proposal_id),
            Input::Approval(a) => format!("approval:{}", a.approval_id),
            Input::Outcome(o) => format!("outcome:{}", o.outcome_id),
            Input::Control(c) => format!("control:{}", c.control_id),
            Input::Timer(t) => format!("timer:{}:{}", t.due_at, t.target.id()),
        }
    }

    /// The operation key the input is about, when it names one (the partitioning key).
    pub fn operation_key(&self) -> Option<&str> {
        match self {
            Input::Proposal(p) => Some(&p.operation_key),
            Input::Approval(a) => Some(&a.operation_key),
            Input::Outcome(o) => Some(&o.operation_key),
            Input::Control(c) => c.operation_key.as_deref(),
            Input::Timer(t) => match &t.target {
                TimerTarget::Effect(key) => Some(key),
                _ => None,
            },
        }
    }
}

impl Input {
    /// The identifiers a record carries (ids, keys, principals, names): every one is bounded by
    /// `core.max_identifier_bytes` before the input is decided, so that no output that echoes
    /// them (decisions, journal events, dead-letter headers) can grow past a record's limit.
    /// Free text (evidence, comments) is not here: the core truncates what it keeps of it.
    pub fn identifiers(&self) -> Vec<(&'static str, &str)> {
        match self {
            Input::Proposal(p) => vec![
                ("proposal_id", &p.proposal_id),
                ("operation_key", &p.operation_key),
                ("run_id", &p.run_id),
                ("logical_call_id", &p.logical_call_id),
                (
                    "provider_call_id",
                    p.provider_call_id.as_deref().unwrap_or(""),
                ),
                ("tenant_id", &p.tenant_id),
                ("principal_id", &p.principal_id),
                ("lease_owner", &p.lease_owner),
                ("tool", &p.tool),
                ("tool_version", &p.tool_version),
                ("arguments_hash", p.arguments_hash.as_deref().unwrap_or("")),
            ],
            Input::Approval(a) => vec![
                ("approval_id", &a.approval_id),
                ("operation_key", &a.operation_key),
                ("arguments_hash", &a.arguments_hash),
                ("approver_id", &a.approver_id),
                ("tenant_id", &a.tenant_id),
            ],
            Input::Outcome(o) => vec![
                ("outcome_id", &o.outcome_id),
                ("operation_key", &o.operation_key),
                ("connector", &o.connector),
                ("worker_id", &o.worker_id),
                (
                    "provider_reference",
                    o.provider_reference.as_deref().unwrap_or(""),
                ),
            ],
            Input::Control(c) => vec![
                ("control_id", &c.control_id),
                ("operation_key", c.operation_key.as_deref().unwrap_or("")),
                ("run_id", c.run_id.as_deref().unwrap_or("")),
                ("operator_id", &c.operator_id),
            ],
            Input::Timer(_) => Vec::new(),
        }
    }

    /// The first identifier longer than `max` bytes: its field name and length.
    pub fn oversized_identifier(&self, max: usize) -> Option<(&'static str, usize)> {
        self.identifiers()
            .into_iter()
            .find(|(_, value)| value.len() > max)
            .map(|(name, value)| (name, value.len()))
    }
}

impl TimerTarget {
    /// A printable identity: `effect/<key>`, `proposal/<id>`, `run/<id>`.
    pub fn id(&self) -> String {
        match self {
            TimerTarget::Effect(k) => format!("effect/{k}"),
            TimerTarget::Proposal(p) => format!("proposal/{p}"),
            TimerTarget::Run(r) => format!("run/{r}"),
        }
    }
}

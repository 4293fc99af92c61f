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

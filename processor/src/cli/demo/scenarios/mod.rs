//! The seed workshop's failures, one function each, run in order against the live stack. Each
//! scenario uses operation keys and agent runs of its own (so they are independent), says what
//! it is doing as it goes, records what its keys should end with in its [`Report`], and checks
//! the replies it is about on the way. A wait that gives up ends the scenario (its report says
//! why) and the demo goes on with the next one.
//!
//! # Layout
//! - `unknown`: a lost response; a crash after the debit before the record (UNKNOWN, then
//!   reconciliation).
//! - `retry`: a blind retry; a changed amount under the same key.
//! - `approval`: a refund approved, one rejected by the approver, one policy denies.
//! - `takeover`: a connector worker frozen mid-call, replaced, resumed.
//! - `refusals`: a stale agent lease fence; a malformed record.

mod approval;
mod refusals;
mod retry;
mod takeover;
mod unknown;

use std::io::Write;
use std::time::Duration;

use airlock_schemas::{Decision, Reason, ToolProposal, Verdict};

use super::report::Report;
use super::stack::Stack;
use super::watch::Watch;
use crate::sample;

/// One scenario: its title and what it does.
pub type Scenario = (
    &'static str,
    fn(&mut Ctx<'_>, &mut Report) -> anyhow::Result<()>,
);

/// Every scenario, in the order they run.
pub const ALL: &[Scenario] = &[
    ("a lost response", unknown::lost_response),
    (
        "a crash after the debit, before the record",
        unknown::crash_after_commit,
    ),
    ("a blind retry", retry::blind_retry),
    ("a changed amount under the same key", retry::changed_amount),
    (
        "refunds that need approval: one approved, one rejected; one policy denies",
        approval::approvals,
    ),
    (
        "a stale connector worker after a takeover",
        takeover::stale_worker,
    ),
    ("a stale agent lease fence", refusals::stale_lease),
    ("a malformed record", refusals::malformed),
];

/// What a scenario works with.
pub struct Ctx<'a> {
    pub watch: &'a mut Watch,
    pub stack: &'a mut Stack,
    pub out: &'a mut dyn Write,
    /// This demo run's id: every operation key and agent run starts with it.
    pub run: String,
    /// The demo's start, the `proposed_at` of its proposals (epoch ms).
    pub now: i64,
    /// The bound on every wait.
    pub wait: Duration,
}

impl Ctx<'_> {
    pub fn key(&self, name: &str) -> String {
        format!("refund:{}-{name}", self.run)
    }

    /// A refund of `minor_units` euro cents under operation key `name` and an agent run of the
    /// same name, followed as part of scenario `label`.
    pub fn refund(&mut self, label: &str, name: &str, minor_units: i64) -> ToolProposal {
        let key = self.key(name);
        let mut p = sample::refund(&key, minor_units, self.now);
        p.run_id = format!("{}-{name}", self.run);
        self.watch.track(&key, label);
        p
    }

    /// A progress line.
    pub fn say(&mut self, text: &str) -> anyhow::Result<()> {
        writeln!(self.out, "  * {text}")?;
        Ok(())
    }

    /// Publishes `p`, named `what` in progress lines and the report when it is not the first
    /// proposal of its key.
    pub fn propose(&mut self, p: &ToolProposal, what: Option<&str>) -> anyhow::Result<()> {
        if let Some(what) = what {
            self.watch.name_input(&p.proposal_id, what);
        }
        self.watch.propose(p)
    }

    /// Waits for the first decision replying to input `id`.
    pub fn reply(&mut self, id: &str, what: &str) -> anyhow::Result<Decision> {
        let within = self.wait;
        self.watch
            .wait_for(self.out, what, within, |w| Ok(w.reply(id)))
    }

    /// Waits for a decision about `key` that satisfies `pred`.
    pub fn until(
        &mut self,
        key: &str,
        what: &str,
        pred: impl Fn(&Decision) -> bool,
    ) -> anyhow::Result<Decision> {
        let within = self.wait;
        self.watch
            .wait_for(self.out, what, within, |w| Ok(w.decision(key, &pred)))
    }

    pub fn until_committed(&mut self, key: &str) -> anyhow::Result<Decision> {
        self.until(key, &format!("{key} to be COMMITTED"), |d| {
            d.verdict == Verdict::Committed
        })
    }

    /// Waits for `key` to be COMMITTED, which reconciliation must have settled.
    pub fn until_reconciled(&mut self, key: &str, r: &mut Report) -> anyhow::Result<()> {
        let settled = self.until_committed(key)?;
        r.check(
            "the settlement",
            &settled,
            (Verdict::Committed, Reason::Reconciled),
        );
        Ok(())
    }
}

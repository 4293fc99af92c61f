//! `airlock settle <operation-key> --committed|--failed --evidence TEXT --operator ID`: an
//! operator closes an effect that reconciliation could not prove either way (OPERATOR_REQUIRED,
//! or still UNKNOWN). The settlement is a Control record on the control topic, decided by the
//! partition's owner like any input and journaled with the operator as the principal; the
//! command waits for the owner's answer and exits non-zero unless the effect was settled.
//!
//! The control id is derived from the key, the outcome, the operator and the evidence, so
//! running the same command twice (a lost terminal, a retry) publishes the same settlement,
//! which the processor answers once.

use std::io::Write;

use airlock_schemas::{Control, ControlKind, Reason};

use super::ask::{self, Request};
use crate::capability::PersonAct;
use crate::runtime::topics::Names;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The operation key of the effect to settle.
    pub operation_key: String,
    /// The effect happened (proof in --evidence).
    #[arg(long, conflicts_with = "failed", required_unless_present = "failed")]
    pub committed: bool,
    /// The effect did not happen (proof in --evidence); the intent may be retried.
    #[arg(long)]
    pub failed: bool,
    /// What proves it (a statement line, a ticket); kept in the journal.
    #[arg(long)]
    pub evidence: String,
    /// The operator's principal id, recorded as the settlement's principal.
    #[arg(long, env = "AIRLOCK_OPERATOR")]
    pub operator: String,
    /// The operator's Ed25519 signing key (`airlock keygen`), whose verifying key the policy
    /// entities register for them (`verifying_keys`); without it the record leaves unsigned,
    /// which the processor refuses for anyone with keys registered.
    #[arg(long, env = "AIRLOCK_SIGNING_KEY")]
    pub signing_key: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub common: ask::Common,
}

pub fn run(args: &Args, out: &mut impl Write) -> anyhow::Result<()> {
    let config = args.common.load()?;
    let asker = ask::Asker::new(&config)?;
    let names = Names::new(&config.topics.prefix);
    let kind = if args.committed {
        ControlKind::SettleCommitted
    } else {
        ControlKind::SettleFailed
    };
    let control_id = control_id(&args.operation_key, kind, &args.operator, &args.evidence);
    let control = Control {
        control_id: control_id.clone(),
        kind,
        operation_key: Some(args.operation_key.clone()),
        run_id: None,
        lease_fence: None,
        operator_id: args.operator.clone(),
        evidence: Some(args.evidence.clone()),
        issued_at: crate::runtime::clock::wall_ms(),
    };
    let payload = asker.encode(&control)?;
    let request = Request {
        headers: ask::person_signature(
            args.signing_key.as_deref(),
            PersonAct::Control,
            &args.operator,
            &payload,
        )?,
        topic: names.control(),
        operation_key: &args.operation_key,
        partition: None,
        payload,
        reply_to: &control_id,
        done: |d| d.reason == Reason::OperatorSettled,
        answer_ids: vec![format!("c/{control_id}")],
    };
    let answer = ask::publish_and_await(&asker, "settle", &request, args.common.timeout(), || {
        writeln!(
            out,
            "published {} for {} as {control_id}; waiting for the processor",
            kind.as_str(),
            args.operation_key
        )?;
        Ok(())
    })?;
    ask::print_answer(out, &request, &answer)?;
    let answer = answer.decision;
    anyhow::ensure!(
        answer.reason == Reason::OperatorSettled,
        "the processor did not settle {}: {}",
        args.operation_key,
        answer.reason.as_str()
    );
    Ok(())
}

/// The settlement's id: the same command gives the same id, so a repeat is one settlement.
fn control_id(key: &str, kind: ControlKind, operator: &str, evidence: &str) -> String {
    ask::content_id("settle", &[key, kind.as_str(), operator, evidence])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_settlement_has_the_same_id() {
        let a = control_id("refund:1", ControlKind::SettleCommitted, "olga", "stmt 4");
        assert_eq!(
            a,
            control_id("refund:1", ControlKind::SettleCommitted, "olga", "stmt 4")
        );
        assert_ne!(
            a,
            control_id("refund:1", ControlKind::SettleFailed, "olga", "stmt 4")
        );
        // Length-prefixed: moving a boundary changes the id.
        assert_ne!(
            control_id("ab", ControlKind::SettleFailed, "c", "d"),
            control_id("a", ControlKind::SettleFailed, "bc", "d")
        );
    }
}

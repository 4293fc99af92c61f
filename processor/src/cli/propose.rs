//! `airlock propose --tool T --operation-key K --arguments JSON ...`: publishes one tool proposal
//! as an agent would (Avro single-object encoding on the proposals topic, keyed by the
//! operation key) and prints the processor's answer. For operators and smoke tests; agents
//! publish their own records.
//!
//! Exit status: zero when the proposal was accepted, is waiting for approval, was answered
//! from an earlier decision (DUPLICATE, IN_PROGRESS), or is a resend of one whose intent has
//! since committed; non-zero when it was refused, its intent ended otherwise (FAILED, UNKNOWN,
//! EXPIRED, CANCELLED: said as such, not as a refusal) or no answer came in time. The
//! proposal id is derived from the proposal's identity (key, arguments, principal, run,
//! logical call) unless given, so running the same command again is a resend.

use std::io::Write;

use airlock_schemas::{ToolProposal, Verdict};
use anyhow::Context;

use super::ask::{self, Request};
use crate::core::canonical;
use crate::runtime::topics::Names;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The tool to call (a name in the tool registry).
    #[arg(long)]
    pub tool: String,
    /// The tool's version.
    #[arg(long, default_value = "1")]
    pub tool_version: String,
    /// The identity of the side effect (the idempotency scope).
    #[arg(long)]
    pub operation_key: String,
    /// The arguments, a JSON object (or `@file` to read them from a file).
    #[arg(long)]
    pub arguments: String,
    #[arg(long)]
    pub tenant: String,
    /// The agent's principal id.
    #[arg(long)]
    pub principal: String,
    #[arg(long, default_value = "cli")]
    pub run_id: String,
    #[arg(long, default_value = "step-1")]
    pub logical_call_id: String,
    /// The run lease's owner and fence (DESIGN.md section 5, fence 2).
    #[arg(long, default_value = "cli")]
    pub lease_owner: String,
    #[arg(long, default_value_t = 1)]
    pub lease_fence: i64,
    /// The intent's deadline, in seconds from now.
    #[arg(long, default_value_t = 3_600)]
    pub deadline_seconds: u64,
    /// The proposal id (default: derived from the proposal's identity).
    #[arg(long)]
    pub proposal_id: Option<String>,
    #[command(flatten)]
    pub common: ask::Common,
}

pub fn run(args: &Args, out: &mut impl Write) -> anyhow::Result<()> {
    let config = args.common.load()?;
    let asker = ask::Asker::new(&config)?;
    let proposal = proposal(args, crate::runtime::clock::wall_ms())?;
    let names = Names::new(&config.topics.prefix);
    let request = Request {
        headers: Vec::new(),
        topic: names.proposals(),
        operation_key: &proposal.operation_key,
        partition: None,
        payload: asker.encode(&proposal)?,
        reply_to: &proposal.proposal_id,
        // Any answer about this proposal (the latest shows where its intent stands: approved,
        // committed), but not a refusal of another proposal that reused its id (`r/...`).
        done: |d| !d.decision_id.starts_with("r/"),
        answer_ids: vec![
            format!("p/{}", proposal.proposal_id),
            format!(
                "r/{}/{}",
                proposal.proposal_id,
                crate::core::machine::proposal_fingerprint(&proposal)
            ),
        ],
    };
    let answer =
        ask::publish_and_await(&asker, "propose", &request, args.common.timeout(), || {
            writeln!(
                out,
                "published {} of {} as {}; waiting for the processor",
                proposal.tool, proposal.operation_key, proposal.proposal_id
            )?;
            Ok(())
        })?;
    ask::print_answer(out, &request, &answer)?;
    let answer = answer.decision;
    if let Some(hash) = &answer.arguments_hash {
        writeln!(out, "arguments_hash: {hash}")?;
    }
    match answer.verdict {
        // Accepted, waiting, answered from an earlier decision, or (a resend of a proposal
        // whose intent since committed) done.
        Verdict::Accepted
        | Verdict::PendingApproval
        | Verdict::Duplicate
        | Verdict::InProgress
        | Verdict::Committed => Ok(()),
        // A resend of a proposal whose intent has since ended otherwise: not a refusal.
        Verdict::Failed | Verdict::Unknown | Verdict::Expired | Verdict::Cancelled => {
            anyhow::bail!(
                "the proposal {} was accepted before; its intent is {} ({})",
                proposal.proposal_id,
                answer.verdict.as_str(),
                answer.reason.as_str()
            )
        }
        _ => anyhow::bail!(
            "the processor refused the proposal {}: {}",
            proposal.proposal_id,
            answer.reason.as_str()
        ),
    }
}

fn proposal(args: &Args, now: i64) -> anyhow::Result<ToolProposal> {
    let text = match args.arguments.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("reading the arguments from {path}"))?,
        None => args.arguments.clone(),
    };
    // Refused here with the JSON path, before anything is sent (the processor would refuse
    // it too, as MALFORMED).
    let hash = canonical::canonicalize(&text)
        .context("the arguments")?
        .hash;
    let deadline_ms =
        i64::try_from(args.deadline_seconds.saturating_mul(1_000)).unwrap_or(i64::MAX);
    let mut proposal = ToolProposal {
        proposal_id: String::new(),
        operation_key: args.operation_key.clone(),
        run_id: args.run_id.clone(),
        logical_call_id: args.logical_call_id.clone(),
        provider_call_id: None,
        tenant_id: args.tenant.clone(),
        principal_id: args.principal.clone(),
        tool: args.tool.clone(),
        tool_version: args.tool_version.clone(),
        arguments_json: text,
        arguments_hash: Some(hash),
        lease_owner: args.lease_owner.clone(),
        lease_fence: args.lease_fence,
        deadline_at: now.saturating_add(deadline_ms),
        proposed_at: now,
    };
    proposal.proposal_id = match &args.proposal_id {
        Some(id) => id.clone(),
        None => ask::proposal_id(&proposal),
    };
    Ok(proposal)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(arguments: &str) -> Args {
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        Cli::parse_from([
            "propose",
            "--tool",
            "refund",
            "--operation-key",
            "refund:txn_1",
            "--arguments",
            arguments,
            "--tenant",
            "acme",
            "--principal",
            "agent-support-1",
        ])
        .args
    }

    #[test]
    fn the_same_proposal_is_a_resend_and_other_arguments_are_another() {
        let a = proposal(&parse(r#"{"b":1,"a":2}"#), 1_000).unwrap();
        // Key order does not matter: the id binds the canonical arguments.
        let again = proposal(&parse(r#"{"a":2, "b":1}"#), 5_000).unwrap();
        assert_eq!(a.proposal_id, again.proposal_id);
        assert_eq!(a.deadline_at, 1_000 + 3_600_000);
        assert_eq!(
            a.arguments_hash.as_deref(),
            Some(canonical::arguments_hash(r#"{"a":2,"b":1}"#).as_str())
        );
        let other = proposal(&parse(r#"{"a":3,"b":1}"#), 1_000).unwrap();
        assert_ne!(a.proposal_id, other.proposal_id);
    }

    #[test]
    fn arguments_that_are_not_canonical_json_are_refused_before_anything_is_sent() {
        let err = format!("{:#}", proposal(&parse(r#"{"a":1.5}"#), 0).unwrap_err());
        assert!(err.contains("the arguments"), "{err}");
    }
}

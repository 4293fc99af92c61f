//! Inputs Airlock refuses before anything is reserved: a proposal from an agent worker whose
//! run lease was taken over (a lower lease fence than one already accepted: STALE_FENCE), and a
//! record that is not a proposal at all (to the dead-letter topic, with its reason; the
//! processor carries on).

use airlock_schemas::{EffectState, Reason, Verdict};

use super::Ctx;
use crate::cli::demo::report::Report;
use crate::runtime::partitioner::partition_for;

pub fn stale_lease(cx: &mut Ctx<'_>, r: &mut Report) -> anyhow::Result<()> {
    // The new owner of the run proposes under fence 5; the old one, which has not heard of the
    // takeover, under fence 4. A run's fence is kept per partition: both keys on one partition.
    let mut current = cx.refund("stale lease", "lease-new", 100);
    current.lease_fence = 5;
    let partitions = cx.watch.partitions;
    let partition = partition_for(current.operation_key.as_bytes(), partitions);
    let name = (0..)
        .map(|i| format!("lease-old{i}"))
        .find(|n| partition_for(cx.key(n).as_bytes(), partitions) == partition)
        .expect("some key lands on every partition");
    let mut zombie = cx.refund("stale lease", &name, 100);
    zombie.run_id = current.run_id.clone();
    zombie.lease_owner = "worker-b".to_owned();
    zombie.lease_fence = 4;
    r.expect(&current.operation_key, 1, 1, Some(EffectState::Committed));
    r.expect(&zombie.operation_key, 0, 0, None);

    cx.propose(&current, None)?;
    let reply = cx.reply(&current.proposal_id, "the new lease owner's decision")?;
    r.check("fence 5", &reply, (Verdict::Accepted, Reason::AutoApproved));
    cx.say("the run's previous lease owner, unaware of the takeover, proposes under fence 4")?;
    cx.propose(&zombie, Some("fence 4"))?;
    let reply = cx.reply(&zombie.proposal_id, "the stale owner's decision")?;
    r.check("fence 4", &reply, (Verdict::Rejected, Reason::StaleFence));
    cx.until_committed(&current.operation_key)?;
    Ok(())
}

pub fn malformed(cx: &mut Ctx<'_>, r: &mut Report) -> anyhow::Result<()> {
    let key = cx.key("junk");
    cx.watch.track(&key, "malformed record");
    r.expect(&key, 0, 0, None);
    let topic = cx.watch.names.proposals();
    cx.say("an agent publishes JSON where an Avro proposal belongs")?;
    cx.watch.send(&topic, &key, b"{\"not\":\"avro\"}")?;
    let within = cx.wait;
    let dlq = cx.watch.names.dlq();
    let reasons = cx
        .watch
        .wait_for(cx.out, &format!("the record in {dlq}"), within, |w| {
            let letters = w.history(&key).dead_letters;
            Ok((!letters.is_empty()).then_some(letters))
        })?;
    r.note(format!(
        "dead-lettered to {dlq} with airlock-dlq-reason {}",
        reasons.join(", ")
    ));
    Ok(())
}

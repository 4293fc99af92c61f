//! Replaying one partition's journal (DESIGN.md section 8): apply every event's state writes in
//! sequence order to a fresh projection, verify the projection hash at every CHECKPOINT, check
//! the invariants, and name every anomaly of the record stream with its offsets.
//!
//! What the stream may legitimately hold besides one event per sequence:
//! - byte-identical copies of an event (an outbox resent after a crash): skipped;
//! - records of a zombie owner behind a newer fence marker: dropped by the caller's fence filter;
//! - *orphans*: events an owner journaled whose state never reached the changelog before it
//!   died or was fenced. The next owner restored the state without them and journals the same
//!   sequences again under its higher owner epoch. The replay rolls back to that sequence and
//!   drops the orphans.
//!
//! The projection is kept as row digests ([`Digests`]): each write is hashed as the live store
//! held it, straight from the journal's JSON, and only 32 bytes per row are kept.
//!
//! Rolling back needs the recent events: each of the last `window` events keeps an undo log
//! (the digests of the rows it overwrote, as they were), so every event is applied once and a
//! rollback restores them in reverse order of application. Memory is bounded by the number of
//! rows plus that window. An event is final (counted, checked against the invariants) when it
//! leaves the window or the replay ends.

use std::collections::{BTreeMap, VecDeque};

use airlock_schemas::{JournalEvent, JournalKind};
use sha2::{Digest, Sha256};

use super::invariants::{Breach, Invariants};
use crate::core::reducer;
use crate::store::digests::{Digests, Prior};

/// An anomaly of the journal, with where it was read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finding {
    /// A record that is not a journal event (altered bytes, a foreign writer).
    Undecodable { offset: i64, detail: String },
    /// An event whose state writes the reducer cannot apply.
    Unreducible {
        offset: i64,
        sequence: i64,
        detail: String,
    },
    /// Sequences that never appeared (a dropped record), first noticed at `offset`.
    Missing { from: i64, to: i64, offset: i64 },
    /// A sequence that appeared after a later one.
    Reordered { sequence: i64, offset: i64 },
    /// A second, different event under a sequence already applied, not from a newer owner.
    Conflicting {
        sequence: i64,
        offset: i64,
        first_offset: i64,
    },
    /// A newer owner rewrote sequences older than the replay keeps: they cannot be rolled back.
    RewindBeyondWindow { sequence: i64, offset: i64 },
    /// The rebuilt projection differs from the hash the live task recorded.
    CheckpointMismatch {
        sequence: i64,
        offset: i64,
        recorded: String,
        rebuilt: String,
    },
    /// A dispatch command on a dispatch topic without a dispatch intent in the journal.
    UnintendedDispatch {
        topic: String,
        offset: i64,
        operation_key: String,
        epoch: i64,
    },
    /// An invariant broken by the event at `offset`.
    Invariant {
        sequence: i64,
        offset: i64,
        breach: Breach,
    },
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Finding::Undecodable { offset, detail } => {
                write!(f, "offset {offset}: not a journal event: {detail}")
            }
            Finding::Unreducible {
                offset,
                sequence,
                detail,
            } => write!(f, "offset {offset}: sequence {sequence}: {detail}"),
            Finding::Missing { from, to, offset } => write!(
                f,
                "sequences {from}..{to} missing (noticed at offset {offset})"
            ),
            Finding::Reordered { sequence, offset } => write!(
                f,
                "offset {offset}: sequence {sequence} arrived after a later one (reordered)"
            ),
            Finding::Conflicting {
                sequence,
                offset,
                first_offset,
            } => write!(
                f,
                "offset {offset}: sequence {sequence} differs from the event at offset {first_offset} (altered or forged)"
            ),
            Finding::RewindBeyondWindow { sequence, offset } => write!(
                f,
                "offset {offset}: a newer owner rewrote sequence {sequence}, older than the replay window"
            ),
            Finding::CheckpointMismatch {
                sequence,
                offset,
                recorded,
                rebuilt,
            } => write!(
                f,
                "offset {offset}: checkpoint {sequence} records projection {recorded}, the replay rebuilt {rebuilt}"
            ),
            Finding::UnintendedDispatch {
                topic,
                offset,
                operation_key,
                epoch,
            } => write!(
                f,
                "{topic} offset {offset}: key {operation_key}: epoch {epoch} was dispatched without a journaled dispatch intent"
            ),
            Finding::Invariant {
                sequence,
                offset,
                breach,
            } => write!(
                f,
                "offset {offset}: sequence {sequence}: key {}: {}: {}",
                breach.operation_key,
                breach.rule.as_str(),
                breach.detail
            ),
        }
    }
}

/// What a partition's replay counted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Events applied and final.
    pub events: u64,
    /// Byte-identical copies skipped.
    pub duplicates: u64,
    /// Records dropped by the owner-epoch fence (counted by the caller).
    pub fenced: u64,
    /// Events of an owner whose state a newer owner never saw, rolled back.
    pub orphans: u64,
    /// Rollbacks to a newer owner's sequence.
    pub rewinds: u64,
    /// Checkpoints whose hash matched.
    pub checkpoints: u64,
    /// Dispatch commands checked against the journal's intents (by the caller).
    pub dispatches_checked: u64,
    /// Findings, all kinds (only the first `MAX_FINDINGS` are kept).
    pub findings: u64,
    /// The sequence after the last applied event.
    pub next_sequence: i64,
}

/// A finished partition replay.
#[derive(Debug)]
pub struct Outcome {
    pub partition: i32,
    /// The rebuilt projection hash after the last event.
    pub projection: String,
    pub counts: Counts,
    pub findings: Vec<Finding>,
    /// The journal's facts: the dispatch topics are checked against them.
    pub invariants: Invariants,
}

impl Outcome {
    /// Records a finding found outside the journal (the dispatch topics).
    pub fn add(&mut self, f: Finding) {
        self.counts.findings += 1;
        if self.findings.len() < MAX_FINDINGS {
            self.findings.push(f);
        }
    }
}

/// Findings kept per partition; the rest are only counted.
pub const MAX_FINDINGS: usize = 1000;

/// Rows as they were before an event's writes, in order of application.
type Undo = Vec<Prior>;

#[derive(Debug)]
struct Pending {
    offset: i64,
    event: JournalEvent,
    digest: [u8; 32],
    /// The rows the event's writes replaced, as they were.
    undo: Undo,
    /// A checkpoint's verdict, decided when it was applied (the projection then).
    checkpoint: Option<Result<(), Finding>>,
}

/// One partition's replay.
#[derive(Debug)]
pub struct PartitionReplay {
    partition: i32,
    window: usize,
    /// The rows of every applied event, as digests; pending events are applied in sequence
    /// order.
    projection: Digests,
    pending: VecDeque<Pending>,
    next_sequence: i64,
    /// Sequences not seen yet below `next_sequence`: start -> (end, offset noticed).
    gaps: BTreeMap<i64, (i64, i64)>,
    invariants: Invariants,
    counts: Counts,
    findings: Vec<Finding>,
}

impl PartitionReplay {
    /// A replay of `partition` from its first journal event, rolling back at most `window`
    /// events.
    pub fn new(partition: i32, window: usize) -> Self {
        PartitionReplay {
            partition,
            window: window.max(1),
            projection: Digests::default(),
            pending: VecDeque::new(),
            next_sequence: 0,
            gaps: BTreeMap::new(),
            invariants: Invariants::default(),
            counts: Counts::default(),
            findings: Vec::new(),
        }
    }

    pub fn partition(&self) -> i32 {
        self.partition
    }

    /// A record the fence filter dropped.
    pub fn fenced(&mut self) {
        self.counts.fenced += 1;
    }

    /// A record that is not a journal event.
    pub fn undecodable(&mut self, offset: i64, detail: String) {
        self.find(Finding::Undecodable { offset, detail });
    }

    /// Applies one admitted journal event read at `offset`; `payload` is its record value.
    pub fn event(&mut self, offset: i64, payload: &[u8], event: JournalEvent) {
        let digest: [u8; 32] = Sha256::digest(payload).into();
        let seq = event.sequence;
        if seq >= self.next_sequence {
            if seq > self.next_sequence {
                self.gaps.insert(self.next_sequence, (seq, offset));
            }
            return self.push(offset, event, digest);
        }
        // An older sequence: a copy, a newer owner's rewrite, or an anomaly.
        let at = self.pending_index(seq);
        if let Some(i) = at
            && self.pending[i].digest == digest
        {
            self.counts.duplicates += 1;
            return;
        }
        if self.take_gap(seq) {
            self.find(Finding::Reordered {
                sequence: seq,
                offset,
            });
            // Put in its place: the later pending events are rolled back, this one applied, and
            // they are applied again (their checkpoints verified again), so one swap does not
            // fail every later checkpoint.
            let at = self.pending.partition_point(|p| p.event.sequence < seq);
            let later: Vec<Pending> = self.pending.drain(at..).collect();
            for p in later.iter().rev() {
                self.undo(&p.undo);
            }
            let undo = self.apply(offset, &event);
            self.pending.push_back(Pending {
                offset,
                event,
                digest,
                undo,
                checkpoint: None,
            });
            for mut p in later {
                // Their writes were read before (a finding then, if unreadable).
                p.undo = reducer::raw_writes_of(&p.event)
                    .map(|writes| writes.iter().map(|w| self.projection.apply(w)).collect())
                    .unwrap_or_default();
                if p.checkpoint.is_some() {
                    p.checkpoint = Some(self.verify(&p.event, p.offset));
                }
                self.pending.push_back(p);
            }
            return;
        }
        let newer_owner = self
            .pending
            .iter()
            .rev()
            .take_while(|p| p.event.sequence >= seq)
            .all(|p| p.event.owner_epoch < event.owner_epoch);
        match at {
            Some(i) if newer_owner => {
                self.rewind(i);
                self.push(offset, event, digest);
            }
            Some(i) => {
                let first_offset = self.pending[i].offset;
                self.find(Finding::Conflicting {
                    sequence: seq,
                    offset,
                    first_offset,
                });
            }
            None if newer_owner && self.pending.front().is_none_or(|p| p.event.sequence > seq) => {
                self.find(Finding::RewindBeyondWindow {
                    sequence: seq,
                    offset,
                });
            }
            None => {
                // Older than the window and not a newer owner's: a late copy can no longer be
                // compared; counted, not judged.
                self.counts.duplicates += 1;
            }
        }
    }

    /// Ends the replay: every pending event becomes final.
    pub fn finish(mut self) -> Outcome {
        let pending: Vec<Pending> = self.pending.drain(..).collect();
        for p in pending {
            self.finalize(p);
        }
        let gaps = std::mem::take(&mut self.gaps);
        for (from, (to, offset)) in gaps {
            self.find(Finding::Missing { from, to, offset });
        }
        self.counts.next_sequence = self.next_sequence;
        Outcome {
            partition: self.partition,
            projection: self.projection.hash(),
            counts: self.counts,
            findings: self.findings,
            invariants: self.invariants,
        }
    }

    /// The projection hash of everything applied so far, pending events included.
    pub fn projection_hash(&self) -> String {
        self.projection.hash()
    }

    /// Applies the event's state writes; returns what they replaced. None are applied (and a
    /// finding is made) when the reducer cannot read them.
    fn apply(&mut self, offset: i64, event: &JournalEvent) -> Undo {
        match reducer::raw_writes_of(event) {
            Ok(writes) => writes.iter().map(|w| self.projection.apply(w)).collect(),
            Err(e) => {
                self.find(Finding::Unreducible {
                    offset,
                    sequence: event.sequence,
                    detail: e.to_string(),
                });
                Vec::new()
            }
        }
    }

    fn push(&mut self, offset: i64, event: JournalEvent, digest: [u8; 32]) {
        let undo = self.apply(offset, &event);
        let checkpoint =
            (event.kind == JournalKind::Checkpoint).then(|| self.verify(&event, offset));
        self.next_sequence = event.sequence + 1;
        self.pending.push_back(Pending {
            offset,
            event,
            digest,
            undo,
            checkpoint,
        });
        while self.pending.len() > self.window {
            let done = self.pending.pop_front().expect("the window is not empty");
            self.finalize(done);
        }
    }

    /// A checkpoint's verdict: its recorded projection hash against the projection now.
    fn verify(&self, event: &JournalEvent, offset: i64) -> Result<(), Finding> {
        let rebuilt = self.projection.hash();
        match &event.projection_hash {
            Some(recorded) if *recorded == rebuilt => Ok(()),
            recorded => Err(Finding::CheckpointMismatch {
                sequence: event.sequence,
                offset,
                recorded: recorded.clone().unwrap_or_else(|| "nothing".to_owned()),
                rebuilt,
            }),
        }
    }

    /// Restores the rows an event replaced.
    fn undo(&mut self, undo: &Undo) {
        for prior in undo.iter().rev() {
            self.projection.undo(prior);
        }
    }

    /// Drops pending events from index `i` on (a newer owner rewrites them), restoring the
    /// rows they replaced, newest first.
    fn rewind(&mut self, i: usize) {
        let dropped: Vec<Pending> = self.pending.drain(i..).collect();
        self.counts.orphans += dropped.len() as u64;
        self.counts.rewinds += 1;
        for p in dropped.iter().rev() {
            self.undo(&p.undo);
        }
    }

    fn finalize(&mut self, p: Pending) {
        self.counts.events += 1;
        match p.checkpoint {
            Some(Ok(())) => self.counts.checkpoints += 1,
            Some(Err(f)) => self.find(f),
            None => {}
        }
        for breach in self.invariants.observe(&p.event) {
            self.find(Finding::Invariant {
                sequence: p.event.sequence,
                offset: p.offset,
                breach,
            });
        }
    }

    fn pending_index(&self, seq: i64) -> Option<usize> {
        self.pending
            .binary_search_by_key(&seq, |p| p.event.sequence)
            .ok()
    }

    /// Removes `seq` from the gaps, if it was one.
    fn take_gap(&mut self, seq: i64) -> bool {
        let Some((&from, &(to, offset))) = self.gaps.range(..=seq).next_back() else {
            return false;
        };
        if seq >= to {
            return false;
        }
        self.gaps.remove(&from);
        if from < seq {
            self.gaps.insert(from, (seq, offset));
        }
        if seq + 1 < to {
            self.gaps.insert(seq + 1, (to, offset));
        }
        true
    }

    fn find(&mut self, f: Finding) {
        self.counts.findings += 1;
        if self.findings.len() < MAX_FINDINGS {
            self.findings.push(f);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use airlock_schemas::{Codec, EffectState, OutcomeKind};

    use super::*;
    use crate::core::Input;
    use crate::sample;

    /// A bare journal event of `kind` for `key`.
    pub(crate) fn event(
        sequence: i64,
        kind: JournalKind,
        key: &str,
        epoch: i64,
        state: Option<EffectState>,
    ) -> JournalEvent {
        JournalEvent {
            partition: 0,
            sequence,
            owner_epoch: 1,
            task: "t".to_owned(),
            reducer_version: crate::core::record::REDUCER_VERSION,
            kind,
            cause_id: format!("c{sequence}"),
            operation_key: Some(key.to_owned()),
            run_id: None,
            proposal_id: None,
            principal_id: None,
            tenant_id: None,
            tool: None,
            policy_bundle_hash: None,
            lease_fence: None,
            epoch: Some(epoch),
            verdict: None,
            reason: None,
            state,
            arguments_hash: None,
            evidence: None,
            record_json: None,
            projection_hash: None,
            recorded_at: 0,
        }
    }

    /// A real journal from the reference core: proposals, their outcomes and checkpoints.
    fn journal(keys: usize) -> anyhow::Result<Vec<JournalEvent>> {
        let core = Arc::new(sample::reference_core(crate::core::Config::default())?);
        let mut task = sample::memory_task(core)?;
        let mut out = Vec::new();
        for i in 0..keys {
            let now = 1_000 + i as i64;
            let p = sample::refund(&format!("k{i}"), 500 + i as i64, now);
            out.extend(task.handle(&Input::Proposal(p.clone()), now)?.journal);
            if i % 3 == 0 {
                let o = sample::outcome(&p.operation_key, 1, OutcomeKind::Committed, "ref-1");
                out.extend(task.handle(&Input::Outcome(o), now + 1)?.journal);
            }
            if i % 4 == 3 {
                out.push(task.checkpoint(now + 2)?);
            }
        }
        task.commit()?;
        Ok(out)
    }

    fn replay(
        records: &[(i64, JournalEvent)],
        window: usize,
    ) -> anyhow::Result<(Counts, Vec<Finding>)> {
        let codec = Codec::new();
        let mut r = PartitionReplay::new(0, window);
        for (offset, e) in records {
            let bytes = codec.encode_single_object(e)?;
            r.event(*offset, &bytes, e.clone());
        }
        let outcome = r.finish();
        Ok((outcome.counts, outcome.findings))
    }

    fn numbered(events: Vec<JournalEvent>) -> Vec<(i64, JournalEvent)> {
        events
            .into_iter()
            .enumerate()
            .map(|(i, e)| (i as i64, e))
            .collect()
    }

    #[test]
    fn an_untouched_journal_verifies_every_checkpoint() -> anyhow::Result<()> {
        let events = journal(40)?;
        let (counts, findings) = replay(&numbered(events.clone()), 4)?;
        assert_eq!(findings, Vec::new());
        assert_eq!(counts.checkpoints, 10);
        assert_eq!(counts.events, events.len() as u64);
        Ok(())
    }

    #[test]
    fn resent_copies_are_skipped_and_a_newer_owner_rolls_orphans_back() -> anyhow::Result<()> {
        let events = journal(12)?;
        let mut records = numbered(events.clone());
        // A crash resend: the last three events again, byte for byte.
        let n = records.len();
        for i in n - 3..n {
            records.push(((records.len()) as i64, records[i].1.clone()));
        }
        // A takeover: the new owner (epoch 2) journals the last two sequences again without
        // the orphans' state (here: the same transitions; what matters is the epoch).
        for e in &events[events.len() - 2..] {
            let mut e = e.clone();
            e.owner_epoch = 2;
            e.task = "new".to_owned();
            records.push((records.len() as i64, e));
        }
        let (counts, findings) = replay(&records, 8)?;
        assert_eq!(findings, Vec::new());
        assert_eq!(counts.duplicates, 3);
        assert_eq!(counts.orphans, 2);
        assert_eq!(counts.rewinds, 1);
        assert_eq!(counts.events, events.len() as u64);
        Ok(())
    }

    #[test]
    fn a_late_event_is_put_in_its_place_and_a_later_rollback_keeps_it() -> anyhow::Result<()> {
        let events = journal(12)?;
        let n = events.len();
        let codec = Codec::new();
        let run = |records: &[JournalEvent]| -> anyhow::Result<Outcome> {
            let mut r = PartitionReplay::new(0, 8);
            for (offset, e) in records.iter().enumerate() {
                r.event(offset as i64, &codec.encode_single_object(e)?, e.clone());
            }
            Ok(r.finish())
        };
        let clean = run(&events)?;
        // Sequence n-5 arrives late, after n-3 (n-4 and n-3 are applied again after it).
        let mut records = events.clone();
        let late = records.remove(n - 5);
        records.insert(n - 3, late);
        // Then a new owner rewrites n-3.. (its predecessor's tail never reached the changelog).
        for e in &events[n - 3..] {
            let mut e = e.clone();
            e.owner_epoch = 2;
            records.push(e);
        }
        let outcome = run(&records)?;
        assert_eq!(outcome.counts.orphans, 3);
        assert_eq!(outcome.counts.rewinds, 1);
        assert!(
            outcome
                .findings
                .iter()
                .any(|f| matches!(f, Finding::Reordered { .. })),
            "{:?}",
            outcome.findings
        );
        assert_eq!(outcome.projection, clean.projection);
        Ok(())
    }

    #[test]
    fn a_dropped_record_a_swap_and_an_altered_event_are_each_named() -> anyhow::Result<()> {
        let events = journal(24)?;
        assert!(events.len() > 30);
        let clean = numbered(events);
        let kinds = |f: &[Finding]| -> Vec<&'static str> {
            f.iter()
                .map(|f| match f {
                    Finding::Missing { .. } => "missing",
                    Finding::Reordered { .. } => "reordered",
                    Finding::CheckpointMismatch { .. } => "checkpoint",
                    _ => "other",
                })
                .collect()
        };

        let mut dropped = clean.clone();
        dropped.remove(3);
        let (_, findings) = replay(&dropped, 4)?;
        assert!(
            findings
                .iter()
                .any(|f| matches!(f, Finding::Missing { from: 3, to: 4, .. })),
            "{findings:?}"
        );

        let mut swapped = clean.clone();
        swapped.swap(10, 11);
        let (_, findings) = replay(&swapped, 4)?;
        assert!(
            findings.iter().any(|f| matches!(
                f,
                Finding::Reordered {
                    sequence: 10,
                    offset: 10
                }
            )),
            "{findings:?}"
        );
        assert_eq!(kinds(&findings), ["reordered"], "{findings:?}");

        // An effect write redirected to another key, with checkpoints after it.
        let mut altered = clean.clone();
        let victim = altered[15..]
            .iter_mut()
            .find(|(_, e)| {
                e.record_json
                    .as_ref()
                    .is_some_and(|j| j.contains("\"key\":\"k"))
            })
            .expect("an effect write");
        victim.1.record_json = victim
            .1
            .record_json
            .as_ref()
            .map(|j| j.replacen("\"key\":\"k", "\"key\":\"x", 1));
        let (_, findings) = replay(&altered, 4)?;
        assert!(!findings.is_empty());
        assert!(
            kinds(&findings).iter().all(|k| *k == "checkpoint"),
            "{findings:?}"
        );
        Ok(())
    }
}

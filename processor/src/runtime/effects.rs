//! Every effect's and run's current record, read from the changelog: the read model behind
//! `airlock effects list` and `airlock runs show`.
//!
//! The changelog holds each partition's state as its owners wrote it, compacted to the latest
//! row per key. Reading it as a restore does (fence-filtered; a batch's rows applied only once
//! its last row is read, so a batch in progress or cut by a crash is left out; a tombstone
//! deletes) gives each effect as an instance restoring the partition now would have it: the
//! state as of the partition's last whole batch, whichever instances own the partitions and
//! however many run. It needs read access to the changelog only, and no processor to answer.
//!
//! Memory: the effect and run records of one partition at a time (a purged intent is gone; a
//! closed one is a small marker; a run record is a few numbers), and the effect and run rows
//! read since the last batch end that survived compaction.

use std::collections::BTreeMap;

use airlock_schemas::{ChangelogRecord, Codec};

use super::partition;
use super::restore::{Row, RowHeaders, WholeBatches, tombstone};
use super::scan::Scanned;
use super::wire::Admit;
use crate::core::record::{EffectRecord, RunRecord};
use crate::store::codec::decode;
use crate::store::keys::Table;

/// One partition's effects, rebuilt record by record from its changelog.
#[derive(Default)]
pub struct ChangelogEffects {
    effects: BTreeMap<String, EffectRecord>,
    /// Each run's lease fence and dispatch count on this partition.
    runs: BTreeMap<String, RunRecord>,
    batches: WholeBatches,
    /// Rows that did not decode (named by `airlock replay`'s checks of the journal; here
    /// counted and skipped).
    pub undecodable: u64,
    /// Rows behind an owner's fence: a zombie's writes, not state.
    pub fenced: u64,
}

impl std::fmt::Debug for ChangelogEffects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChangelogEffects")
            .field("effects", &self.effects.len())
            .field("undecodable", &self.undecodable)
            .field("fenced", &self.fenced)
            .finish()
    }
}

impl ChangelogEffects {
    /// Takes the next changelog record of `partition`, in log order.
    pub fn read(&mut self, partition: i32, codec: &Codec, s: &Scanned<'_>) {
        let RowHeaders {
            batch_end,
            owner_epoch,
            ..
        } = RowHeaders::of(s.headers);
        let epoch = owner_epoch.unwrap_or(0);
        let record = match (s.admit, s.payload) {
            (Admit::Fenced { .. } | Admit::Marker(_) | Admit::Forged(_), _) => None,
            (Admit::Accept, Some(payload)) => match codec.decode_as::<ChangelogRecord>(payload) {
                Ok(r) => Some(r),
                Err(_) => {
                    self.undecodable += 1;
                    return;
                }
            },
            (Admit::Accept, None) => match tombstone(partition, epoch, s.key) {
                Some(r) => Some(r),
                None => {
                    self.undecodable += 1;
                    return;
                }
            },
        };
        self.take(s.offset, s.admit, record, batch_end);
    }

    /// Takes record `offset` as the fence classed it, decoded when accepted, and whether it
    /// carried the batch-end header.
    fn take(
        &mut self,
        offset: i64,
        admit: Admit,
        record: Option<ChangelogRecord>,
        batch_end: bool,
    ) {
        let record = match (admit, record) {
            (Admit::Accept, Some(record)) => record,
            (Admit::Fenced { .. }, _) => {
                self.fenced += 1;
                return;
            }
            _ => return,
        };
        // As a restore reads it: a batch's last row carries the end header, or (rows written
        // before the header existed) the input offsets.
        let ends_batch = batch_end || !record.input_offsets.is_empty();
        // Only effect and run rows are held until their batch ends (a batch's end row is mostly
        // a meta row, and compaction removes most of them, so rows wait long); another table's
        // row matters only as the end of its batch.
        let record = if matches!(
            partition::store_table(record.table),
            Table::Effect | Table::Run
        ) {
            record
        } else if ends_batch {
            ChangelogRecord {
                key: Vec::new(),
                value: None,
                input_offsets: Vec::new(),
                ..record
            }
        } else {
            return;
        };
        for (_, record) in self.batches.row(offset, Row { record, ends_batch }) {
            self.apply(record);
        }
    }

    fn apply(&mut self, record: ChangelogRecord) {
        let table = partition::store_table(record.table);
        if !matches!(table, Table::Effect | Table::Run) {
            return;
        }
        let Ok(key) = String::from_utf8(record.key) else {
            self.undecodable += 1;
            return;
        };

        match (table, record.value) {
            (Table::Effect, None) => {
                self.effects.remove(&key);
            }
            (_, None) => {
                self.runs.remove(&key);
            }
            (Table::Effect, Some(bytes)) => match decode::<EffectRecord>(table, &key, &bytes) {
                Ok(effect) => {
                    self.effects.insert(key, effect);
                }
                Err(_) => self.undecodable += 1,
            },
            (_, Some(bytes)) => match decode::<RunRecord>(table, &key, &bytes) {
                Ok(run) => {
                    self.runs.insert(key, run);
                }
                Err(_) => self.undecodable += 1,
            },
        }
    }

    /// The effects of every whole batch read, by operation key.
    pub fn into_effects(self) -> BTreeMap<String, EffectRecord> {
        self.effects
    }

    /// The effects (by operation key) and the runs (by run id) of every whole batch read.
    pub fn into_state(self) -> (BTreeMap<String, EffectRecord>, BTreeMap<String, RunRecord>) {
        (self.effects, self.runs)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use airlock_schemas::StateTable;

    use super::*;
    use crate::core::record::State;
    use crate::sample;

    fn effect_row(key: &str, state: State) -> ChangelogRecord {
        let rec = sample::effect_record(key, state);
        row(
            StateTable::Effect,
            key,
            Some(crate::store::codec::frame(
                &serde_json::to_string(&rec).unwrap(),
                None,
            )),
        )
    }

    fn row(table: StateTable, key: &str, value: Option<Vec<u8>>) -> ChangelogRecord {
        ChangelogRecord {
            partition: 0,
            owner_epoch: 1,
            table,
            key: key.as_bytes().to_vec(),
            value,
            input_offsets: Vec::new(),
            written_at: 0,
        }
    }

    fn meta_end() -> ChangelogRecord {
        row(StateTable::Meta, "journal_sequence", Some(vec![0]))
    }

    fn states(e: ChangelogEffects) -> Vec<(String, &'static str)> {
        e.into_effects()
            .into_iter()
            .map(|(k, r)| (k, r.effect_state().as_str()))
            .collect()
    }

    const UNKNOWN: State = State::Unknown {
        since: 1,
        rounds: 2,
        next_reconcile_at: 3,
    };

    #[test]
    fn only_whole_batches_count_and_fenced_rows_and_markers_do_not() {
        let mut e = ChangelogEffects::default();
        e.take(0, Admit::Accept, Some(effect_row("k1", UNKNOWN)), false);
        e.take(1, Admit::Accept, Some(meta_end()), true);
        // A zombie's row behind the fence, a marker, then a batch cut short by a crash.
        e.take(
            2,
            Admit::Fenced {
                owner_epoch: 1,
                fence: 2,
            },
            Some(effect_row("k2", UNKNOWN)),
            true,
        );
        e.take(3, Admit::Marker(2), None, false);
        e.take(4, Admit::Accept, Some(effect_row("k3", UNKNOWN)), false);
        assert_eq!(e.fenced, 1);
        assert_eq!(states(e), [("k1".to_owned(), "UNKNOWN")]);
    }

    #[test]
    fn a_later_row_replaces_and_a_tombstone_deletes() {
        let mut e = ChangelogEffects::default();
        e.take(0, Admit::Accept, Some(effect_row("k1", UNKNOWN)), false);
        e.take(1, Admit::Accept, Some(effect_row("k2", UNKNOWN)), true);
        let committed = State::Committed {
            receipt: String::new(),
            evidence: String::new(),
            settled_at: 5,
        };
        e.take(2, Admit::Accept, Some(effect_row("k1", committed)), false);
        e.take(
            3,
            Admit::Accept,
            Some(row(StateTable::Effect, "k2", None)),
            false,
        );
        e.take(4, Admit::Accept, Some(meta_end()), true);
        assert_eq!(states(e), [("k1".to_owned(), "COMMITTED")]);
    }

    fn run_row(run: &str, fence: i64) -> ChangelogRecord {
        let rec = RunRecord {
            highest_fence: fence,
            dispatches: 2,
            updated_at: 1,
            expires_at: 9,
        };
        row(
            StateTable::Run,
            run,
            Some(crate::store::codec::frame(
                &serde_json::to_string(&rec).unwrap(),
                None,
            )),
        )
    }

    #[test]
    fn run_rows_count_by_whole_batches_too() {
        let mut e = ChangelogEffects::default();
        e.take(0, Admit::Accept, Some(run_row("r1", 4)), false);
        e.take(1, Admit::Accept, Some(meta_end()), true);
        e.take(2, Admit::Accept, Some(run_row("r1", 5)), false);
        e.take(3, Admit::Accept, Some(run_row("r2", 1)), false);
        // The batch above never ended: r1 stays at 4, r2 is not there.
        let (_, runs) = e.into_state();
        assert_eq!(runs.len(), 1);
        assert_eq!(runs["r1"].highest_fence, 4);
        let mut e = ChangelogEffects::default();
        e.take(0, Admit::Accept, Some(run_row("r1", 4)), true);
        e.take(
            1,
            Admit::Accept,
            Some(row(StateTable::Run, "r1", None)),
            true,
        );
        assert!(e.into_state().1.is_empty(), "a tombstone deletes the run");
    }

    #[test]
    fn a_row_that_does_not_decode_is_counted() {
        let mut e = ChangelogEffects::default();
        e.take(
            0,
            Admit::Accept,
            Some(row(StateTable::Effect, "k1", Some(b"not a row".to_vec()))),
            true,
        );
        assert_eq!(e.undecodable, 1);
        assert!(states(e).is_empty());
    }
}

//! Every effect's current record, read from the changelog: the read model behind
//! `airlock effects list`.
//!
//! The changelog holds each partition's state as its owners wrote it, compacted to the latest
//! row per key. Reading it as a restore does (fence-filtered; a batch's rows applied only once
//! its last row is read, so a batch in progress or cut by a crash is left out; a tombstone
//! deletes) gives each effect as an instance restoring the partition now would have it: the
//! state as of the partition's last whole batch, whichever instances own the partitions and
//! however many run. It needs read access to the changelog only, and no processor to answer.
//!
//! Memory: the effect records of one partition at a time (a purged intent is gone; a closed
//! one is a small marker), and the effect rows read since the last batch end that survived
//! compaction.

use std::collections::BTreeMap;

use airlock_schemas::{ChangelogRecord, Codec};
use rdkafka::message::Headers;

use super::partition;
use super::restore::{Row, WholeBatches, tombstone};
use super::scan::Scanned;
use super::wire::{self, Admit};
use crate::core::record::EffectRecord;
use crate::store::keys::Table;

/// One partition's effects, rebuilt record by record from its changelog.
#[derive(Default)]
pub struct ChangelogEffects {
    effects: BTreeMap<String, EffectRecord>,
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
        match s.admit {
            Admit::Accept => {}
            Admit::Fenced { .. } => {
                self.fenced += 1;
                return;
            }
            Admit::Marker(_) | Admit::Forged(_) => return,
        }
        let mut batch_end = false;
        let mut epoch = 0;
        if let Some(headers) = s.headers {
            for h in headers.iter() {
                match h.key {
                    wire::header::BATCH_END => batch_end = true,
                    wire::header::OWNER_EPOCH => {
                        epoch = h
                            .value
                            .and_then(|v| std::str::from_utf8(v).ok())
                            .and_then(|v| v.parse().ok())
                            .unwrap_or(0);
                    }
                    _ => {}
                }
            }
        }
        let record = match s.payload {
            Some(payload) => match codec.decode_as::<ChangelogRecord>(payload) {
                Ok(r) => r,
                Err(_) => {
                    self.undecodable += 1;
                    return;
                }
            },
            None => match tombstone(partition, epoch, s.key) {
                Some(r) => r,
                None => {
                    self.undecodable += 1;
                    return;
                }
            },
        };
        // As a restore reads it: a batch's last row carries the end header, or (rows written
        // before the header existed) the input offsets.
        let ends_batch = batch_end || !record.input_offsets.is_empty();
        // Only effect rows are held until their batch ends (a batch's end row is mostly a meta
        // row, and compaction removes most of them, so rows wait long); another table's row
        // matters only as the end of its batch.
        let record = if partition::store_table(record.table) == Table::Effect {
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
        for (_, record) in self.batches.row(s.offset, Row { record, ends_batch }) {
            self.apply(record);
        }
    }

    fn apply(&mut self, record: ChangelogRecord) {
        if partition::store_table(record.table) != Table::Effect {
            return;
        }
        let Ok(key) = String::from_utf8(record.key) else {
            self.undecodable += 1;
            return;
        };
        match record.value {
            None => {
                self.effects.remove(&key);
            }
            Some(bytes) => {
                match crate::store::codec::decode::<EffectRecord>(Table::Effect, &key, &bytes) {
                    Ok(effect) => {
                        self.effects.insert(key, effect);
                    }
                    Err(_) => self.undecodable += 1,
                }
            }
        }
    }

    /// The effects of every whole batch read, by operation key.
    pub fn into_effects(self) -> BTreeMap<String, EffectRecord> {
        self.effects
    }
}

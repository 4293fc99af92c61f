//! A projection kept as row digests only: per row, the share it XORs into the projection hash
//! (see [`StateStore`](super::StateStore)), never the row itself. What an auditor's replay
//! needs to check the hashes a live task recorded: each journaled write is hashed as the store
//! held it ([`RawWrite`]: the record's JSON behind the value header), and 32 bytes per row are
//! kept instead of the record, so a replay's memory is the number of keys, not their size.

use std::collections::HashMap;

use super::codec::Header;
use super::keys::Table;
use super::{row_digest, xor};
use crate::core::reducer::{RawWrite, Row};

/// A row's digest before a write replaced it (`None`: there was no row).
pub type Prior = (Vec<u8>, Option<[u8; 32]>);

/// Row digests by full store key, and their XOR: the projection hash.
#[derive(Debug, Default)]
pub struct Digests {
    rows: HashMap<Vec<u8>, [u8; 32]>,
    hash: [u8; 32],
}

impl Digests {
    /// Applies one write; returns the row's key and its digest before, to undo it later.
    pub fn apply(&mut self, write: &RawWrite<'_>) -> Prior {
        let table = match write.row {
            Row::Effect => Table::Effect,
            Row::Proposal => Table::Proposal,
            Row::Run => Table::Run,
        };
        let key = table.key(write.id.as_bytes());
        let new = write
            .record
            .map(|r| row_digest(&key, &[Header::new(r.timer).as_bytes(), r.json.as_bytes()]));
        let old = self.put(&key, new);
        (key, old)
    }

    /// Puts back what [`apply`](Self::apply) returned.
    pub fn undo(&mut self, (key, old): &Prior) {
        self.put(key, *old);
    }

    /// The projection hash, hex: equal to the store's over the same rows.
    pub fn hash(&self) -> String {
        hex::encode(self.hash)
    }

    /// Rows in the projection.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    fn put(&mut self, key: &[u8], new: Option<[u8; 32]>) -> Option<[u8; 32]> {
        let old = match new {
            Some(d) => {
                xor(&mut self.hash, &d);
                match self.rows.get_mut(key) {
                    Some(slot) => Some(std::mem::replace(slot, d)),
                    None => self.rows.insert(key.to_vec(), d),
                }
            }
            None => self.rows.remove(key),
        };
        if let Some(old) = &old {
            xor(&mut self.hash, old);
        }
        old
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;

    use airlock_schemas::OutcomeKind;

    use super::*;
    use crate::core::{Input, reducer};
    use crate::sample;
    use crate::store::{self, Store};

    /// The digests of a real journal's raw writes hash like the store over the decoded writes,
    /// at every step: rows created, overwritten (timers moved) and purged.
    #[test]
    fn raw_writes_hash_like_the_store_holds_them() {
        let core = Arc::new(sample::reference_core(crate::core::Config::default()).unwrap());
        let mut task = sample::memory_task(core).unwrap();
        let mut digests = Digests::default();
        let mut writes = Vec::new();
        let mut priors = Vec::new();
        let t0 = 1_790_000_000_000;
        for i in 0..20 {
            let now = t0 + i * 1_000;
            let key = format!("refund:digests:{i}");
            let mut inputs = vec![Input::Proposal(sample::refund(&key, 100 + i, now))];
            if i % 3 != 0 {
                inputs.push(Input::Outcome(sample::outcome(
                    &key,
                    1,
                    OutcomeKind::AttemptStarted,
                    "ledger",
                )));
            }
            if i % 3 == 1 {
                inputs.push(Input::Outcome(sample::outcome(
                    &key,
                    1,
                    OutcomeKind::Committed,
                    "ledger",
                )));
            }
            for input in inputs {
                for event in task.handle(&input, now).unwrap().journal {
                    writes.extend(reducer::writes_of(&event).unwrap());
                    for raw in reducer::raw_writes_of(&event).unwrap() {
                        priors.push(digests.apply(&raw));
                    }
                    assert_eq!(digests.hash(), store::projection_of(&writes).unwrap());
                }
            }
            task.commit().unwrap();
        }
        // Timers due much later fire: attempts time out, committed rows are purged.
        let late = t0 + 400 * 24 * 3_600_000;
        for effects in task.fire_timers(late, 1_000).unwrap() {
            for event in effects.journal {
                writes.extend(reducer::writes_of(&event).unwrap());
                for raw in reducer::raw_writes_of(&event).unwrap() {
                    priors.push(digests.apply(&raw));
                }
            }
        }
        assert_eq!(digests.hash(), store::projection_of(&writes).unwrap());
        assert_eq!(digests.hash(), task.store().projection_hash());
        // Undone newest first, nothing is left.
        for prior in priors.iter().rev() {
            digests.undo(prior);
        }
        assert!(digests.is_empty());
        assert_eq!(digests.hash(), hex::encode([0u8; 32]));
    }
}

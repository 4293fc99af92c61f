//! RocksDB key layout: one byte of table prefix, then the table's own key. Prefixes are fixed
//! and never reused after retirement, so an old store can never be misread by a newer build.

use crate::core::{TimerFired, TimerTarget};

/// The tables of the state store. The discriminants are on disk: never renumber, never reuse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Table {
    /// operation key → `EffectRecord`
    Effect = 0x01,
    /// proposal id → `ProposalSeen`
    Proposal = 0x02,
    /// run id → `RunRecord`
    Run = 0x03,
    /// due time, target → () : the timer index, a projection of the three tables above
    Timer = 0x04,
    /// input topic/partition → next offset to consume (written with the state it produced)
    Offset = 0x05,
    /// outbox sequence → output record not yet acknowledged by the broker
    Outbox = 0x06,
    /// name → value: projection hash, owner epoch, journal sequence
    Meta = 0x07,
}

impl Table {
    pub const ALL: &'static [Table] = &[
        Table::Effect,
        Table::Proposal,
        Table::Run,
        Table::Timer,
        Table::Offset,
        Table::Outbox,
        Table::Meta,
    ];

    pub fn prefix(self) -> u8 {
        self as u8
    }

    pub fn from_prefix(byte: u8) -> Option<Table> {
        Table::ALL.iter().copied().find(|t| t.prefix() == byte)
    }

    /// `[prefix] ++ id`.
    pub fn key(self, id: &[u8]) -> Vec<u8> {
        let mut key = Vec::with_capacity(1 + id.len());
        key.push(self.prefix());
        key.extend_from_slice(id);
        key
    }

    /// The half-open key range `[prefix, prefix + 1)` of the whole table.
    pub fn range(self) -> (Vec<u8>, Vec<u8>) {
        (vec![self.prefix()], vec![self.prefix() + 1])
    }
}

const TARGET_EFFECT: u8 = 1;
const TARGET_PROPOSAL: u8 = 2;
const TARGET_RUN: u8 = 3;

/// Order-preserving encoding of a signed time: flip the sign bit, big endian.
pub fn encode_time(t: i64) -> [u8; 8] {
    ((t as u64) ^ (1 << 63)).to_be_bytes()
}

pub fn decode_time(bytes: [u8; 8]) -> i64 {
    (u64::from_be_bytes(bytes) ^ (1 << 63)) as i64
}

/// `[Timer] ++ due_at ++ target tag ++ id`: iterating the table yields timers in due order.
pub fn timer_key(t: &TimerFired) -> Vec<u8> {
    let (tag, id) = match &t.target {
        TimerTarget::Effect(k) => (TARGET_EFFECT, k),
        TimerTarget::Proposal(p) => (TARGET_PROPOSAL, p),
        TimerTarget::Run(r) => (TARGET_RUN, r),
    };
    let mut key = Vec::with_capacity(10 + id.len());
    key.push(Table::Timer.prefix());
    key.extend_from_slice(&encode_time(t.due_at));
    key.push(tag);
    key.extend_from_slice(id.as_bytes());
    key
}

/// The first timer key due strictly after `t` (exclusive upper bound for "due by t").
pub fn timer_bound(t: i64) -> Vec<u8> {
    let mut key = vec![Table::Timer.prefix()];
    key.extend_from_slice(&encode_time(t.saturating_add(1)));
    key
}

pub fn decode_timer_key(key: &[u8]) -> Option<TimerFired> {
    if key.len() < 10 || key[0] != Table::Timer.prefix() {
        return None;
    }
    let due_at = decode_time(key[1..9].try_into().ok()?);
    let id = String::from_utf8(key[10..].to_vec()).ok()?;
    let target = match key[9] {
        TARGET_EFFECT => TimerTarget::Effect(id),
        TARGET_PROPOSAL => TimerTarget::Proposal(id),
        TARGET_RUN => TimerTarget::Run(id),
        _ => return None,
    };
    Some(TimerFired { due_at, target })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn table_prefixes_are_frozen() {
        let prefixes: Vec<u8> = Table::ALL.iter().map(|t| t.prefix()).collect();
        assert_eq!(prefixes, vec![1, 2, 3, 4, 5, 6, 7]);
        for t in Table::ALL {
            assert_eq!(Table::from_prefix(t.prefix()), Some(*t));
        }
    }

    proptest! {
        #[test]
        fn time_encoding_preserves_order(a in any::<i64>(), b in any::<i64>()) {
            prop_assert_eq!(a.cmp(&b), encode_time(a).cmp(&encode_time(b)));
            prop_assert_eq!(decode_time(encode_time(a)), a);
        }

        #[test]
        fn timer_keys_sort_by_due_time_and_round_trip(
            a in any::<i64>(), b in any::<i64>(), ka in "[a-z:0-9]{1,12}", kb in "[a-z:0-9]{1,12}"
        ) {
            let ta = TimerFired { due_at: a, target: TimerTarget::Effect(ka) };
            let tb = TimerFired { due_at: b, target: TimerTarget::Proposal(kb) };
            if a != b {
                prop_assert_eq!(a.cmp(&b), timer_key(&ta).cmp(&timer_key(&tb)));
            }
            prop_assert_eq!(decode_timer_key(&timer_key(&ta)), Some(ta.clone()));
            prop_assert!(timer_key(&ta) < timer_bound(a));
            if a < i64::MAX {
                let later = TimerFired { due_at: a + 1, ..ta.clone() };
                prop_assert!(timer_key(&later) >= timer_bound(a));
            }
        }
    }
}

//! An in-memory [`Backend`]: a sorted map. Used by tests and the deterministic simulation; a
//! clone is a snapshot of the committed state (what survives a crash).

use std::collections::BTreeMap;
use std::ops::Bound;

use super::{Backend, Result, Visitor};

#[derive(Clone, Debug, Default)]
pub struct MemoryBackend {
    map: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl Backend for MemoryBackend {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.map.get(key).cloned())
    }

    fn visit(&self, start: &[u8], end: &[u8], limit: usize, f: &mut Visitor<'_>) -> Result<usize> {
        let mut n = 0;
        let bounds = (Bound::Included(start), Bound::Excluded(end));
        for (k, v) in self.map.range::<[u8], _>(bounds).take(limit) {
            f(k, v)?;
            n += 1;
        }
        Ok(n)
    }

    fn write_batch(&mut self, batch: Vec<(Vec<u8>, Option<Vec<u8>>)>) -> Result<()> {
        for (k, v) in batch {
            match v {
                Some(v) => self.map.insert(k, v),
                None => self.map.remove(&k),
            };
        }
        Ok(())
    }
}

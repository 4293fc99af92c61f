//! The value format of the state store and the changelog: a version byte, the row's timer (so
//! that overwriting a row does not need to decode it to find the timer to move), then the
//! record as JSON. JSON keeps records readable by auditors and other languages; the version
//! byte lets a later format coexist with this one during an upgrade.
//!
//! ```text
//! [VALUE_FORMAT] [0 | 1] [due_at: i64 big endian, present when 1] [JSON]
//! ```

use serde::de::DeserializeOwned;

use super::keys::Table;
use super::{Error, Result};

/// The current value format. Never reuse a retired number.
pub const VALUE_FORMAT: u8 = 1;

/// The bytes a value starts with: the format and the row's timer.
#[derive(Clone, Copy, Debug)]
pub struct Header {
    bytes: [u8; 10],
    len: usize,
}

impl Header {
    pub fn new(timer: Option<i64>) -> Self {
        let mut bytes = [0; 10];
        bytes[0] = VALUE_FORMAT;
        match timer {
            Some(due) => {
                bytes[1] = 1;
                bytes[2..].copy_from_slice(&due.to_be_bytes());
                Header { bytes, len: 10 }
            }
            None => Header { bytes, len: 2 },
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// A row: a record already serialized to JSON (see `Write::record_json`, the one serialization
/// the journal and the store share), behind a header with the due time of its timer.
pub fn frame(json: &str, timer: Option<i64>) -> Vec<u8> {
    let header = Header::new(timer);
    let mut out = Vec::with_capacity(header.as_bytes().len() + json.len());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(json.as_bytes());
    out
}

/// The timer due time stored with a row, without decoding the record.
pub fn timer_of(table: Table, id: &str, bytes: &[u8]) -> Result<Option<i64>> {
    let (timer, _) = split(table, id, bytes)?;
    Ok(timer)
}

pub fn decode<T: DeserializeOwned>(table: Table, id: &str, bytes: &[u8]) -> Result<T> {
    let (_, json) = split(table, id, bytes)?;
    serde_json::from_slice(json).map_err(|e| corrupt(table, id, e.to_string()))
}

fn split<'a>(table: Table, id: &str, bytes: &'a [u8]) -> Result<(Option<i64>, &'a [u8])> {
    match bytes {
        [VALUE_FORMAT, 0, json @ ..] => Ok((None, json)),
        [VALUE_FORMAT, 1, rest @ ..] if rest.len() >= 8 => {
            let (due, json) = rest.split_at(8);
            let due = i64::from_be_bytes(due.try_into().expect("split_at(8) gives 8 bytes"));
            Ok((Some(due), json))
        }
        [VALUE_FORMAT, ..] => Err(corrupt(table, id, "truncated header".to_owned())),
        [found, ..] => Err(Error::Version {
            table,
            found: *found,
            expected: VALUE_FORMAT,
        }),
        [] => Err(corrupt(table, id, "empty value".to_owned())),
    }
}

fn corrupt(table: Table, id: &str, detail: String) -> Error {
    Error::Corrupt {
        table,
        key: id.to_owned(),
        detail,
    }
}

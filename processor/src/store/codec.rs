//! The value format of the state store and the changelog: one version byte, then the record as
//! JSON. JSON keeps records readable by auditors and other languages; the version byte lets a
//! later format coexist with this one during an upgrade.

use serde::{Serialize, de::DeserializeOwned};

use super::keys::Table;
use super::{Error, Result};

/// The current value format. Never reuse a retired number.
pub const VALUE_FORMAT: u8 = 1;

pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    let mut out = vec![VALUE_FORMAT];
    serde_json::to_writer(&mut out, value)
        .expect("records are plain data with string keys: serializing them cannot fail");
    out
}

pub fn decode<T: DeserializeOwned>(table: Table, id: &str, bytes: &[u8]) -> Result<T> {
    match bytes.split_first() {
        Some((&VALUE_FORMAT, json)) => serde_json::from_slice(json).map_err(|e| Error::Corrupt {
            table,
            key: id.to_owned(),
            detail: e.to_string(),
        }),
        Some((&found, _)) => Err(Error::Version {
            table,
            found,
            expected: VALUE_FORMAT,
        }),
        None => Err(Error::Corrupt {
            table,
            key: id.to_owned(),
            detail: "empty value".to_owned(),
        }),
    }
}

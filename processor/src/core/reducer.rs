//! State as a projection of the journal: every state change the core makes travels in a journal
//! event (`record_json`, the list of [`Write`]s), so applying the journal in order rebuilds the
//! state, and the projection hash of the rebuilt state must equal the live task's.

use airlock_schemas::JournalEvent;

use super::record::{REDUCER_VERSION, Write};

/// Errors of the reducer: a journal it cannot apply.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "journal event {partition}/{sequence} was written by reducer version {found}; this build reads up to {REDUCER_VERSION}"
    )]
    NewerReducer {
        partition: i32,
        sequence: i64,
        found: i32,
    },
    #[error("journal event {partition}/{sequence} has an undecodable record_json: {source}")]
    Corrupt {
        partition: i32,
        sequence: i64,
        #[source]
        source: serde_json::Error,
    },
}

/// The state writes one journal event carries, in order.
pub fn writes_of(event: &JournalEvent) -> Result<Vec<Write>, Error> {
    if event.reducer_version > REDUCER_VERSION {
        return Err(Error::NewerReducer {
            partition: event.partition,
            sequence: event.sequence,
            found: event.reducer_version,
        });
    }
    match &event.record_json {
        None => Ok(Vec::new()),
        Some(json) => serde_json::from_str(json).map_err(|source| Error::Corrupt {
            partition: event.partition,
            sequence: event.sequence,
            source,
        }),
    }
}

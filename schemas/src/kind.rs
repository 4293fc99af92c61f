//! [`RecordKind`]: the closed list of Airlock's top-level records and their names.

use std::{fmt, str::FromStr};

use crate::{Error, NAMESPACE};

macro_rules! record_kinds {
    ($( $(#[$meta:meta])* $name:ident, )+) => {
        /// One of Airlock's top-level Avro records (one `.avsc` file each).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum RecordKind {
            $( $(#[$meta])* $name, )+
        }

        impl RecordKind {
            /// Every record, in a fixed order.
            pub const ALL: &'static [Self] = &[$(Self::$name,)+];

            /// The record's name without namespace, which is also its `.avsc` file name
            /// (e.g. `ToolProposal`).
            #[must_use]
            pub const fn name(self) -> &'static str {
                match self {
                    $(Self::$name => stringify!($name),)+
                }
            }

            /// The record's full name (e.g. `dev.airlock.v1.ToolProposal`).
            #[must_use]
            pub const fn full_name(self) -> &'static str {
                match self {
                    $(Self::$name => concat!("dev.airlock.v1.", stringify!($name)),)+
                }
            }

            /// The text of the record's current `.avsc` file, as embedded at build time.
            #[must_use]
            pub const fn avsc(self) -> &'static str {
                match self {
                    $(Self::$name => include_str!(concat!("../avro/", stringify!($name), ".avsc")),)+
                }
            }

            /// Position of the record in [`RecordKind::ALL`].
            pub(crate) const fn index(self) -> usize {
                self as usize
            }
        }
    };
}

record_kinds! {
    /// An agent's request to perform a tool call with side effects.
    ToolProposal,
    /// A human decision on a proposal that waits for approval.
    Approval,
    /// What a connector observed about an attempt.
    Outcome,
    /// An operator command.
    Control,
    /// An order to a connector to perform one attempt.
    DispatchCommand,
    /// An order to a connector to find out whether an attempt took effect.
    ReconcileCommand,
    /// Airlock's answer to an input.
    Decision,
    /// One state transition of the processor.
    JournalEvent,
    /// One change to the processor's local state.
    ChangelogRecord,
    /// A signed, hash-chained attestation of a terminal outcome or a refusal.
    Receipt,
}

impl RecordKind {
    /// The record with this name, given either without namespace (`ToolProposal`) or in full
    /// (`dev.airlock.v1.ToolProposal`).
    #[must_use]
    pub fn from_name(name: &str) -> Option<Self> {
        let short = match name.strip_prefix(NAMESPACE) {
            Some(rest) => rest.strip_prefix('.')?,
            None => name,
        };
        Self::ALL.iter().copied().find(|kind| kind.name() == short)
    }
}

impl fmt::Display for RecordKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for RecordKind {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self, Error> {
        Self::from_name(name).ok_or_else(|| Error::UnknownRecordName {
            name: name.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_short_and_full() {
        for kind in RecordKind::ALL {
            assert_eq!(RecordKind::from_name(kind.name()), Some(*kind));
            assert_eq!(kind.full_name().parse::<RecordKind>().ok(), Some(*kind));
            assert_eq!(RecordKind::ALL[kind.index()], *kind);
        }
        assert_eq!(RecordKind::from_name("dev.airlock.v1ToolProposal"), None);
        assert_eq!(RecordKind::from_name("InputOffset"), None);
        assert!(matches!(
            "nope".parse::<RecordKind>(),
            Err(Error::UnknownRecordName { .. })
        ));
    }
}

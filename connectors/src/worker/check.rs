//! The checks a record on a dispatch topic passes before the worker acts on it, without I/O:
//! it decodes to a command of this connector, sits where its operation key belongs, and (for a
//! dispatch) carries a capability that verifies. A refusal names its dead-letter reason; it
//! never becomes an outcome, so a forged or misplaced command cannot settle a real attempt.

use airlock_processor::capability::{self, Refused, VerifyingKey};
use airlock_processor::core::canonical;
use airlock_processor::runtime::partitioner;
use airlock_schemas::{AnyRecord, Codec, DispatchCommand, Reason, ReconcileCommand};

/// A command the worker may act on.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    Dispatch(Box<DispatchCommand>),
    Reconcile(ReconcileCommand),
}

impl Command {
    pub fn operation_key(&self) -> &str {
        match self {
            Command::Dispatch(d) => &d.operation_key,
            Command::Reconcile(r) => &r.operation_key,
        }
    }
}

/// Why a record is dead-lettered: the `airlock-dlq-reason` code and a human detail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub reason: &'static str,
    pub detail: String,
}

impl Refusal {
    fn new(reason: &'static str, detail: impl Into<String>) -> Refusal {
        Refusal {
            reason,
            detail: detail.into(),
        }
    }
}

impl From<Refused> for Refusal {
    fn from(r: Refused) -> Refusal {
        Refusal::new(r.code(), r.to_string())
    }
}

/// What every check needs to know about this worker.
#[derive(Clone, Debug)]
pub struct Checker {
    pub connector: String,
    pub partitions: i32,
    /// Trusted verifying keys of the processor.
    pub keys: Vec<VerifyingKey>,
    /// Commands without a capability are executed (development only).
    pub allow_unsigned: bool,
    pub codec: Codec,
}

impl Checker {
    /// Decodes a record read at `partition` under Kafka key `key` and checks that it is a
    /// command of this connector placed on its operation key's partition.
    pub fn command(
        &self,
        partition: i32,
        key: Option<&[u8]>,
        payload: Option<&[u8]>,
    ) -> Result<Command, Refusal> {
        let payload = payload
            .ok_or_else(|| Refusal::new(Reason::Malformed.as_str(), "record has no value"))?;
        let decoded = self.codec.decode(payload).map_err(|e| {
            let reason = if e.is_foreign() {
                Reason::UnknownSchema
            } else {
                Reason::Malformed
            };
            Refusal::new(reason.as_str(), e.to_string())
        })?;
        let (command, connector, owner_partition, idempotency_key) = match decoded.record {
            AnyRecord::DispatchCommand(d) => {
                let (c, p, k) = (
                    d.connector.clone(),
                    d.owner_partition,
                    d.idempotency_key.clone(),
                );
                (Command::Dispatch(Box::new(d)), c, p, k)
            }
            AnyRecord::ReconcileCommand(r) => {
                let (c, p, k) = (
                    r.connector.clone(),
                    r.owner_partition,
                    r.idempotency_key.clone(),
                );
                (Command::Reconcile(r), c, p, k)
            }
            other => {
                return Err(Refusal::new(
                    Reason::UnknownSchema.as_str(),
                    format!(
                        "a {} record does not belong on a dispatch topic",
                        other.kind()
                    ),
                ));
            }
        };
        if connector != self.connector {
            return Err(Refusal::new(
                Reason::Malformed.as_str(),
                format!(
                    "the command is addressed to connector {connector:?}, this is {:?}",
                    self.connector
                ),
            ));
        }
        let operation_key = command.operation_key();
        if key != Some(operation_key.as_bytes()) {
            return Err(Refusal::new(
                Reason::KeyMismatch.as_str(),
                format!(
                    "the record's Kafka key {:?} is not its operation key {operation_key:?}",
                    key.map(String::from_utf8_lossy)
                ),
            ));
        }
        // A command copied to another partition would escape the attempts that partition's
        // worker has started: it is refused, whatever it carries.
        let home = partitioner::partition_for(operation_key.as_bytes(), self.partitions);
        if home != partition || owner_partition != partition {
            return Err(Refusal::new(
                Reason::KeyMismatch.as_str(),
                format!(
                    "operation key {operation_key:?} belongs to partition {home} (owner partition \
                     {owner_partition}), the command was read on partition {partition}"
                ),
            ));
        }
        // The downstream deduplicates and reconciles on this key: it must be the one derived
        // from the operation key, or a command could look up (and settle by) another effect.
        let derived = canonical::idempotency_key(operation_key);
        if idempotency_key != derived {
            return Err(Refusal::new(
                "FORGED",
                format!(
                    "idempotency key {idempotency_key:?} is not the one derived from operation \
                     key {operation_key:?} ({derived})"
                ),
            ));
        }
        Ok(command)
    }

    /// The capability check of a dispatch command at wall-clock `now` (epoch ms): signed by a
    /// trusted key (or unsigned where allowed), arguments unaltered, not expired. Returns the
    /// canonical arguments.
    pub fn authorize(&self, cmd: &DispatchCommand, now: i64) -> Result<serde_json::Value, Refused> {
        let unsigned_allowed =
            self.allow_unsigned && (cmd.capability.is_none() || self.keys.is_empty());
        if unsigned_allowed {
            capability::arguments_match(cmd)?;
            if now >= cmd.attempt_deadline_at {
                return Err(Refused::Expired {
                    attempt_deadline_at: cmd.attempt_deadline_at,
                    now,
                });
            }
        } else {
            capability::verify_any(&self.keys, cmd, now)?;
        }
        canonical::canonicalize(&cmd.arguments_json)
            .map(|c| c.value)
            .map_err(|e| Refused::ArgumentsAltered(e.to_string()))
    }

    /// The check of a fence marker of `owner_epoch` on `topic`'s `partition` carrying
    /// `capability` (its `airlock-capability` header): signed by a trusted key (or unsigned
    /// where allowed). Only a verified marker may raise the worker's fence: a forged one with a
    /// huge epoch would have it ignore every later command of the partition.
    pub fn authorize_fence(
        &self,
        topic: &str,
        partition: i32,
        owner_epoch: i64,
        capability: Option<&[u8]>,
    ) -> Result<(), Refused> {
        if self.allow_unsigned && (capability.is_none() || self.keys.is_empty()) {
            return Ok(());
        }
        capability::verify_fence_any(&self.keys, capability, topic, partition, owner_epoch)
    }

    /// The capability check of a reconcile command: signed by a trusted key (or unsigned where
    /// allowed). Without it, whoever can write the dispatch topic could have the worker look an
    /// attempt up while it is still running and report the "proof" that it failed.
    pub fn authorize_reconcile(&self, cmd: &ReconcileCommand) -> Result<(), Refused> {
        if self.allow_unsigned && (cmd.capability.is_none() || self.keys.is_empty()) {
            return Ok(());
        }
        capability::verify_reconcile_any(&self.keys, cmd)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use airlock_processor::capability::SigningKey;
    use airlock_schemas::{Framing, OutcomeKind};

    use super::*;

    const NOW: i64 = 1_700_000_000_000;
    const PARTITIONS: i32 = 3;

    fn checker(allow_unsigned: bool) -> Checker {
        Checker {
            connector: "ledger".into(),
            partitions: PARTITIONS,
            keys: vec![SigningKey::from_bytes(&[7; 32]).verifying_key()],
            allow_unsigned,
            codec: Codec::new(),
        }
    }

    fn dispatch(key: &str) -> DispatchCommand {
        let args = r#"{"account_id":"acct-42","amount":{"currency":"EUR","minor_units":5},"tenant_id":"acme"}"#;
        let mut cmd = DispatchCommand {
            command_id: format!("{key}#1"),
            operation_key: key.into(),
            epoch: 1,
            proposal_id: "p".into(),
            tool: "refund".into(),
            tool_version: "1".into(),
            connector: "ledger".into(),
            tenant_id: "acme".into(),
            principal_id: "agent".into(),
            arguments_json: args.into(),
            arguments_hash: canonical::arguments_hash(args),
            idempotency_key: canonical::idempotency_key(key),
            deadline_at: NOW + 60_000,
            attempt_deadline_at: NOW + 10_000,
            attempt_timeout_ms: 10_000,
            policy_bundle_hash: "b".into(),
            owner_partition: partitioner::partition_for(key.as_bytes(), PARTITIONS),
            owner_epoch: 1,
            capability: None,
            issued_at: NOW,
        };
        cmd.capability = Some(capability::sign(&SigningKey::from_bytes(&[7; 32]), &cmd));
        cmd
    }

    fn encode(cmd: &DispatchCommand) -> Vec<u8> {
        Codec::new().encode(Framing::SingleObject, cmd).unwrap()
    }

    #[test]
    fn a_signed_command_on_its_partition_passes() {
        let c = checker(false);
        let cmd = dispatch("refund:txn_1");
        let p = cmd.owner_partition;
        let got = c
            .command(p, Some(b"refund:txn_1"), Some(&encode(&cmd)))
            .unwrap();
        assert_eq!(got, Command::Dispatch(Box::new(cmd.clone())));
        let args = c.authorize(&cmd, NOW).unwrap();
        assert_eq!(args["amount"]["minor_units"], 5);
    }

    #[test]
    fn a_command_copied_to_another_partition_is_refused() {
        let c = checker(false);
        let cmd = dispatch("refund:txn_1");
        let elsewhere = (cmd.owner_partition + 1) % PARTITIONS;
        let err = c
            .command(elsewhere, Some(b"refund:txn_1"), Some(&encode(&cmd)))
            .unwrap_err();
        assert_eq!(err.reason, "KEY_MISMATCH");
        let err = c
            .command(cmd.owner_partition, Some(b"other"), Some(&encode(&cmd)))
            .unwrap_err();
        assert_eq!(err.reason, "KEY_MISMATCH");
    }

    #[test]
    fn garbage_other_records_and_other_connectors_are_dead_lettered() {
        let c = checker(false);
        assert_eq!(
            c.command(0, None, Some(b"garbage")).unwrap_err().reason,
            "UNKNOWN_SCHEMA"
        );
        assert_eq!(
            c.command(0, None, Some(b"\xc3\x01garbage"))
                .unwrap_err()
                .reason,
            "MALFORMED"
        );
        assert_eq!(c.command(0, None, None).unwrap_err().reason, "MALFORMED");
        let mut cmd = dispatch("refund:txn_1");
        cmd.connector = "http".into();
        let err = c
            .command(
                cmd.owner_partition,
                Some(b"refund:txn_1"),
                Some(&encode(&cmd)),
            )
            .unwrap_err();
        assert_eq!(err.reason, "MALFORMED");
        let outcome = airlock_processor::sample::outcome("k", 1, OutcomeKind::Committed, "x");
        let bytes = Codec::new()
            .encode(Framing::SingleObject, &outcome)
            .unwrap();
        assert_eq!(
            c.command(0, Some(b"k"), Some(&bytes)).unwrap_err().reason,
            "UNKNOWN_SCHEMA"
        );
    }

    #[test]
    fn an_idempotency_key_not_derived_from_the_operation_key_is_forged() {
        let c = checker(true);
        let mut cmd = dispatch("refund:txn_1");
        cmd.idempotency_key = canonical::idempotency_key("refund:txn_2");
        let err = c
            .command(
                cmd.owner_partition,
                Some(b"refund:txn_1"),
                Some(&encode(&cmd)),
            )
            .unwrap_err();
        assert_eq!(err.reason, "FORGED");
    }

    #[test]
    fn unsigned_commands_run_only_where_allowed_and_still_checked() {
        let mut cmd = dispatch("refund:txn_1");
        cmd.capability = None;
        assert_eq!(
            checker(false).authorize(&cmd, NOW).unwrap_err(),
            Refused::Missing
        );
        assert!(checker(true).authorize(&cmd, NOW).is_ok());
        cmd.arguments_json = cmd.arguments_json.replace('5', "6");
        assert!(matches!(
            checker(true).authorize(&cmd, NOW),
            Err(Refused::ArgumentsAltered(_))
        ));
        // A capability that is there is verified even where unsigned commands are allowed.
        let mut forged = dispatch("refund:txn_1");
        forged.epoch = 9;
        assert!(matches!(
            checker(true).authorize(&forged, NOW),
            Err(Refused::Forged(_))
        ));
    }

    fn reconcile(key: &str) -> ReconcileCommand {
        let mut cmd = airlock_processor::sample::reconcile_of(&dispatch(key), 1, NOW);
        cmd.capability = Some(capability::sign_reconcile(
            &SigningKey::from_bytes(&[7; 32]),
            &cmd,
        ));
        cmd
    }

    #[test]
    fn a_reconcile_command_must_be_signed_over_every_field() {
        let cmd = reconcile("refund:txn_1");
        assert_eq!(checker(false).authorize_reconcile(&cmd), Ok(()));
        let mut unsigned = cmd.clone();
        unsigned.capability = None;
        assert_eq!(
            checker(false).authorize_reconcile(&unsigned),
            Err(Refused::Missing)
        );
        assert_eq!(checker(true).authorize_reconcile(&unsigned), Ok(()));
        // Another round, epoch or owner epoch under the same signature is forged, where
        // unsigned commands are allowed too.
        for alter in [
            (|c: &mut ReconcileCommand| c.round = 2) as fn(&mut ReconcileCommand),
            |c| c.epoch = 2,
            |c| c.owner_epoch = 9,
            |c| c.idempotency_key = "x".into(),
        ] {
            let mut altered = cmd.clone();
            alter(&mut altered);
            for allow_unsigned in [false, true] {
                assert!(matches!(
                    checker(allow_unsigned).authorize_reconcile(&altered),
                    Err(Refused::Forged(_))
                ));
            }
        }
        // A dispatch command's signature does not verify as a reconcile command's.
        let mut borrowed = cmd.clone();
        borrowed.capability = dispatch("refund:txn_1").capability;
        assert!(matches!(
            checker(false).authorize_reconcile(&borrowed),
            Err(Refused::Forged(_))
        ));
    }
}

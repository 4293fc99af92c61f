//! Airlock's schemas in a Confluent-compatible schema registry (`schema_registry.url`).
//!
//! # Subjects
//!
//! A topic that carries one record type has the subject `<topic>-value` (Confluent's
//! TopicNameStrategy): `<prefix>proposals-value` holds ToolProposal, `approvals` Approval,
//! `outcomes` Outcome, `control` Control, `decisions` Decision, `journal` JournalEvent,
//! `changelog` ChangelogRecord, `receipts` Receipt. The dispatch topics
//! (`<prefix>dispatch.<connector>`, one per connector) carry two record types, DispatchCommand
//! and ReconcileCommand: one subject per topic could hold only one of them under BACKWARD
//! compatibility, so those two use RecordNameStrategy subjects, the record's full name
//! (`dev.airlock.v1.DispatchCommand`, `dev.airlock.v1.ReconcileCommand`), shared by every
//! dispatch topic. The dead-letter topic holds copies of anything and has no subject.
//!
//! # Registration ([`register`], run by `airlock topics create`)
//!
//! Each subject gets compatibility BACKWARD, then every version of its record's schema, oldest
//! first (`schemas/avro/history`, then the current `.avsc` when it differs from the newest
//! snapshot), the `.avsc` text as it is. A version already in the subject is left alone: a
//! second run changes nothing. The registry refuses a version that is not backward compatible
//! with the previous one (HTTP 409); the error carries its message.
//!
//! # Resolution ([`resolve`], run by `airlock run` at start)
//!
//! For each subject the processor needs, every registered version is fetched and matched by
//! Parsing Canonical Form against the versions of the record the subject holds; the id of each
//! match goes into the codec's [`SchemaIds`], so that a Confluent-framed payload written with
//! any of them is decoded like a single-object one. A registered version that is none of
//! Airlock's (a foreign schema, or a newer one than this build knows) is skipped with a warning:
//! payloads carrying its id are dead-lettered as `UNKNOWN_SCHEMA`. A missing subject is an
//! error: the processor refuses to start.
//!
//! # Writing (`schema_registry.framing = "confluent"`)
//!
//! The processor then writes the records other systems read (decisions, journal events,
//! receipts: [`FRAMED_OUTPUTS`]) in the Confluent wire format with the ids of their current
//! schemas, and refuses to start when one has none. The changelog and the dispatch topics
//! stay single-object: only Airlock reads them, and a claim restoring a partition or a
//! connector worker acting on a command must not wait for the registry. Airlock's own readers
//! of the framed topics (`airlock propose/approve/settle` waiting for decisions, `airlock
//! replay`, `audit` and `receipts`, the demo) resolve the ids the same way ([`reader_codec`]);
//! the Python and TypeScript clients given the registry's URL look up the Decision schema's id.
//!
//! Every HTTP call is bounded ([`TIMEOUT`]); the registry's errors are reported by HTTP status
//! (Apicurio's Confluent API does not fill `error_code` on 409).

use std::fmt::Write as _;
use std::io::Write;
use std::time::Duration;

use airlock_schemas::{Codec, RecordKind, SchemaIds, SchemaVersion, parsing_canonical_form};
use anyhow::{Context, bail};
use serde_json::{Value, json};

use super::config::{Config, OutputFraming};

use super::topics::Names;

/// The bound on each HTTP call to the registry (connecting included).
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// The bound on connecting to the registry.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json";

/// One subject and the record whose schemas it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subject {
    pub name: String,
    pub kind: RecordKind,
}

/// The subject of a topic carrying one record type: `<topic>-value`.
pub fn topic_subject(topic: &str) -> String {
    format!("{topic}-value")
}

/// The subject of a record sharing its topic with others: its full name.
pub fn record_subject(kind: RecordKind) -> String {
    kind.full_name().to_owned()
}

/// The subjects of the input topics (what `airlock run` decodes).
pub fn input_subjects(names: &Names) -> Vec<Subject> {
    vec![
        Subject {
            name: topic_subject(&names.proposals()),
            kind: RecordKind::ToolProposal,
        },
        Subject {
            name: topic_subject(&names.approvals()),
            kind: RecordKind::Approval,
        },
        Subject {
            name: topic_subject(&names.outcomes()),
            kind: RecordKind::Outcome,
        },
        Subject {
            name: topic_subject(&names.control()),
            kind: RecordKind::Control,
        },
    ]
}

/// The subjects of the output topics: decisions, journal, changelog, receipts, and the two
/// records of the dispatch topics.
pub fn output_subjects(names: &Names) -> Vec<Subject> {
    let topic = |name: String, kind| Subject {
        name: topic_subject(&name),
        kind,
    };
    vec![
        topic(names.decisions(), RecordKind::Decision),
        topic(names.journal(), RecordKind::JournalEvent),
        topic(names.changelog(), RecordKind::ChangelogRecord),
        topic(names.receipts(), RecordKind::Receipt),
        Subject {
            name: record_subject(RecordKind::DispatchCommand),
            kind: RecordKind::DispatchCommand,
        },
        Subject {
            name: record_subject(RecordKind::ReconcileCommand),
            kind: RecordKind::ReconcileCommand,
        },
    ]
}

/// Every subject, inputs first.
pub fn subjects(names: &Names) -> Vec<Subject> {
    let mut all = input_subjects(names);
    all.extend(output_subjects(names));
    all
}

/// The versions of `kind`'s schema to register, oldest first: the snapshots, then the current
/// schema when its canonical form differs from the newest snapshot's (it never does in a
/// consistent build; the schemas crate's tests check it).
pub fn versions(kind: RecordKind) -> Vec<&'static SchemaVersion> {
    let mut all: Vec<&'static SchemaVersion> = kind.snapshots().iter().collect();
    let current = kind.current();
    if all
        .last()
        .is_none_or(|newest| newest.canonical_form() != current.canonical_form())
    {
        all.push(current);
    }
    all
}

/// The version of `kind`'s schema whose canonical form is `canonical`.
pub fn match_version(kind: RecordKind, canonical: &str) -> Option<&'static SchemaVersion> {
    let found = versions(kind)
        .into_iter()
        .find(|v| v.canonical_form() == canonical)?;
    // The newest snapshot is the current schema: hand out the current one for it.
    kind.version(found.version())
}

/// A blocking client of a registry's Confluent API.
#[derive(Debug)]
pub struct Client {
    base: String,
    http: reqwest::blocking::Client,
}

/// An answer of the registry: its HTTP status and JSON body (`Null` when not JSON).
struct Answer {
    status: u16,
    body: Value,
}

impl Answer {
    /// The registry's `message`, else the body as text.
    fn message(&self) -> String {
        match self.body.get("message").and_then(Value::as_str) {
            Some(m) => m.to_owned(),
            None => self.body.to_string(),
        }
    }
}

impl Client {
    /// A client of the registry at `url` (the base of its Confluent API).
    ///
    /// # Errors
    ///
    /// When the HTTP client cannot be built.
    pub fn new(url: &str) -> anyhow::Result<Self> {
        let http = reqwest::blocking::Client::builder()
            .timeout(TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            .context("building the schema registry's HTTP client")?;
        Ok(Client {
            base: url.trim().trim_end_matches('/').to_owned(),
            http,
        })
    }

    /// The base URL.
    pub fn url(&self) -> &str {
        &self.base
    }

    fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Answer> {
        let url = format!("{}{path}", self.base);
        let mut request = self
            .http
            .request(method.clone(), &url)
            .header("Accept", CONTENT_TYPE);
        if let Some(body) = body {
            request = request
                .header("Content-Type", CONTENT_TYPE)
                .body(body.to_string());
        }
        let response = request.send().with_context(|| {
            format!(
                "schema registry unreachable: {method} {url} (timeout {} s)",
                TIMEOUT.as_secs()
            )
        })?;
        let status = response.status().as_u16();
        let text = response
            .text()
            .with_context(|| format!("reading the schema registry's answer to {method} {url}"))?;
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok(Answer { status, body })
    }

    fn fail<T>(&self, what: &str, answer: &Answer) -> anyhow::Result<T> {
        bail!(
            "schema registry {}: {what}: HTTP {}: {}",
            self.base,
            answer.status,
            answer.message()
        )
    }

    /// The subject's compatibility level, `None` when it has none of its own.
    pub fn compatibility(&self, subject: &str) -> anyhow::Result<Option<String>> {
        let answer = self.call(reqwest::Method::GET, &format!("/config/{subject}"), None)?;
        match answer.status {
            200 => Ok(answer
                .body
                .get("compatibilityLevel")
                .or_else(|| answer.body.get("compatibility"))
                .and_then(Value::as_str)
                .map(str::to_owned)),
            404 => Ok(None),
            _ => self.fail(&format!("reading the compatibility of {subject}"), &answer),
        }
    }

    /// Sets the subject's compatibility level.
    pub fn set_compatibility(&self, subject: &str, level: &str) -> anyhow::Result<()> {
        let answer = self.call(
            reqwest::Method::PUT,
            &format!("/config/{subject}"),
            Some(json!({ "compatibility": level })),
        )?;
        match answer.status {
            200 => Ok(()),
            _ => self.fail(
                &format!("setting the compatibility of {subject} to {level}"),
                &answer,
            ),
        }
    }

    /// The id of `schema` (a schema's JSON text) in `subject`, when registered there.
    pub fn lookup(&self, subject: &str, schema: &str) -> anyhow::Result<Option<u32>> {
        let answer = self.call(
            reqwest::Method::POST,
            &format!("/subjects/{subject}"),
            Some(json!({ "schema": schema })),
        )?;
        match answer.status {
            200 => Ok(Some(self.id_of(&answer, subject)?)),
            404 => Ok(None),
            _ => self.fail(&format!("looking up a schema in {subject}"), &answer),
        }
    }

    /// Registers `schema` under `subject`, returning its id.
    pub fn register(&self, subject: &str, schema: &str) -> anyhow::Result<u32> {
        let answer = self.call(
            reqwest::Method::POST,
            &format!("/subjects/{subject}/versions"),
            Some(json!({ "schema": schema })),
        )?;
        match answer.status {
            200 => self.id_of(&answer, subject),
            409 => self.fail(
                &format!("registering a schema under {subject}: refused as incompatible"),
                &answer,
            ),
            _ => self.fail(&format!("registering a schema under {subject}"), &answer),
        }
    }

    /// The version numbers registered under `subject`, `None` when the subject does not exist.
    pub fn versions(&self, subject: &str) -> anyhow::Result<Option<Vec<u32>>> {
        let answer = self.call(
            reqwest::Method::GET,
            &format!("/subjects/{subject}/versions"),
            None,
        )?;
        match answer.status {
            200 => {
                let versions = answer.body.as_array().and_then(|a| {
                    a.iter()
                        .map(|v| v.as_u64().and_then(|v| u32::try_from(v).ok()))
                        .collect::<Option<Vec<u32>>>()
                });
                match versions {
                    Some(v) => Ok(Some(v)),
                    None => self.fail(
                        &format!("listing the versions of {subject}: not a list of numbers"),
                        &answer,
                    ),
                }
            }
            404 => Ok(None),
            _ => self.fail(&format!("listing the versions of {subject}"), &answer),
        }
    }

    /// The id and schema text of version `version` of `subject`.
    pub fn version(&self, subject: &str, version: u32) -> anyhow::Result<(u32, String)> {
        let answer = self.call(
            reqwest::Method::GET,
            &format!("/subjects/{subject}/versions/{version}"),
            None,
        )?;
        if answer.status != 200 {
            return self.fail(&format!("reading version {version} of {subject}"), &answer);
        }
        let id = self.id_of(&answer, subject)?;
        match answer.body.get("schema").and_then(Value::as_str) {
            Some(schema) => Ok((id, schema.to_owned())),
            None => self.fail(
                &format!("reading version {version} of {subject}: no schema in the answer"),
                &answer,
            ),
        }
    }

    fn id_of(&self, answer: &Answer, subject: &str) -> anyhow::Result<u32> {
        match answer
            .body
            .get("id")
            .and_then(Value::as_u64)
            .and_then(|id| u32::try_from(id).ok())
        {
            Some(id) => Ok(id),
            None => self.fail(&format!("{subject}: no schema id in the answer"), answer),
        }
    }
}

/// Sets BACKWARD compatibility on every subject of `names` and registers every version of its
/// schema, oldest first, reporting each to `out`. A second run registers nothing.
///
/// # Errors
///
/// The registry unreachable or answering with an error, e.g. refusing a version as
/// incompatible (its message included).
pub fn register(client: &Client, names: &Names, out: &mut impl Write) -> anyhow::Result<()> {
    for subject in subjects(names) {
        let level = client.compatibility(&subject.name)?;
        if level.as_deref() != Some("BACKWARD") {
            client.set_compatibility(&subject.name, "BACKWARD")?;
        }
        let mut line = format!("schema   {} (BACKWARD):", subject.name);
        for version in versions(subject.kind) {
            let (id, how) = match client.lookup(&subject.name, version.avsc())? {
                Some(id) => (id, "registered"),
                None => (
                    client
                        .register(&subject.name, version.avsc())
                        .with_context(|| {
                            format!(
                                "registering {} v{} under {}",
                                subject.kind,
                                version.version(),
                                subject.name
                            )
                        })?,
                    "new",
                ),
            };
            write!(line, " v{} id {id} ({how})", version.version())?;
        }
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// Resolves the ids of every version registered under `subjects`, matched by canonical form
/// against Airlock's versions of each subject's record.
///
/// # Errors
///
/// The registry unreachable or answering with an error, a subject missing, a registered
/// schema that does not parse, or one id naming two of Airlock's schemas.
pub fn resolve(client: &Client, subjects: &[Subject]) -> anyhow::Result<SchemaIds> {
    let mut ids = SchemaIds::new();
    for subject in subjects {
        let Some(versions) = client.versions(&subject.name)? else {
            bail!(
                "schema registry {}: subject {} ({}) is missing; run `airlock topics create` \
                 with schema_registry.url set to register Airlock's schemas",
                client.url(),
                subject.name,
                subject.kind
            );
        };
        for number in versions {
            let (id, text) = client.version(&subject.name, number)?;
            let schema = airlock_schemas::Schema::parse_str(&text).with_context(|| {
                format!(
                    "schema registry {}: version {number} of {} (id {id}) does not parse",
                    client.url(),
                    subject.name
                )
            })?;
            let known = parsing_canonical_form(&schema)
                .ok()
                .and_then(|canonical| match_version(subject.kind, &canonical));
            let Some(known) = known else {
                log::warn!(
                    "schema registry: version {number} of {} (id {id}) is none of Airlock's {} \
                     schemas; payloads carrying id {id} are dead-lettered",
                    subject.name,
                    subject.kind
                );
                continue;
            };
            register_id(&mut ids, id, known, &subject.name)?;
        }
    }
    Ok(ids)
}

/// The schema ids `config` calls for: none without `schema_registry.url`; with it, every
/// registered version under `subjects` ([`resolve`]), and, when `schema_registry.framing` is
/// `confluent`, the ids of the current schemas of what is written in it (decisions, journal
/// events, receipts).
///
/// # Errors
///
/// As [`resolve`], with the cause in context; a current schema of an output without an id.
pub fn configured_ids(config: &Config, subjects: &[Subject]) -> anyhow::Result<SchemaIds> {
    let url = config.schema_registry.url.trim();
    if url.is_empty() {
        return Ok(SchemaIds::new());
    }
    let ids = Client::new(url)
        .and_then(|client| resolve(&client, subjects))
        .context("resolving Airlock's schema ids (schema_registry.url)")?;
    if config.schema_registry.framing == OutputFraming::Confluent {
        for kind in FRAMED_OUTPUTS {
            if ids.id_of(kind).is_none() {
                bail!(
                    "schema registry {url}: the current {kind} schema is not registered, and \
                     schema_registry.framing = \"confluent\" writes it with its id; run \
                     `airlock topics create` with this build to register it"
                );
            }
        }
    }
    log::info!("schema registry {url}: {} schema ids resolved", ids.len());
    Ok(ids)
}

/// The records written in `schema_registry.framing`: what other systems read.
pub const FRAMED_OUTPUTS: [RecordKind; 3] = [
    RecordKind::Decision,
    RecordKind::JournalEvent,
    RecordKind::Receipt,
];

/// A codec that reads what the processor writes as `config` says: with the registry's ids when
/// `schema_registry.url` is set (decisions, journal events and receipts may be Confluent
/// framed), else single-object only.
///
/// # Errors
///
/// As [`configured_ids`].
pub fn reader_codec(config: &Config) -> anyhow::Result<Codec> {
    let names = Names::new(&config.topics.prefix);
    Ok(Codec::new().with_schema_ids(configured_ids(config, &subjects(&names))?))
}

fn register_id(
    ids: &mut SchemaIds,
    id: u32,
    known: &'static SchemaVersion,
    subject: &str,
) -> anyhow::Result<()> {
    match ids.register_version(id, known.kind(), known.version()) {
        Ok(_) => Ok(()),
        // The same schema registered twice under different ids (another text of it): the first
        // id is the one read.
        Err(airlock_schemas::Error::DuplicateSchemaId { existing_id, .. }) => {
            log::warn!(
                "schema registry: {subject} holds {} v{} under ids {existing_id} and {id}; \
                 payloads carrying id {id} are dead-lettered",
                known.kind(),
                known.version()
            );
            Ok(())
        }
        Err(e) => Err(e).with_context(|| format!("schema id {id} of {subject}")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn subjects_follow_the_topics_and_the_dispatch_records_their_names() {
        let names = Names::new("t.");
        let all = subjects(&names);
        let find = |name: &str| all.iter().find(|s| s.name == name).map(|s| s.kind);
        assert_eq!(find("t.proposals-value"), Some(RecordKind::ToolProposal));
        assert_eq!(find("t.approvals-value"), Some(RecordKind::Approval));
        assert_eq!(find("t.outcomes-value"), Some(RecordKind::Outcome));
        assert_eq!(find("t.control-value"), Some(RecordKind::Control));
        assert_eq!(find("t.decisions-value"), Some(RecordKind::Decision));
        assert_eq!(find("t.journal-value"), Some(RecordKind::JournalEvent));
        assert_eq!(find("t.changelog-value"), Some(RecordKind::ChangelogRecord));
        assert_eq!(find("t.receipts-value"), Some(RecordKind::Receipt));
        assert_eq!(
            find("dev.airlock.v1.DispatchCommand"),
            Some(RecordKind::DispatchCommand)
        );
        assert_eq!(
            find("dev.airlock.v1.ReconcileCommand"),
            Some(RecordKind::ReconcileCommand)
        );
        assert_eq!(all.len(), 10);
    }

    #[test]
    fn every_version_is_registered_oldest_first_and_matched_back() {
        for &kind in RecordKind::ALL {
            let all = versions(kind);
            assert_eq!(all.len(), kind.snapshots().len(), "{kind}");
            assert!(all.windows(2).all(|w| w[0].version() < w[1].version()));
            for v in &all {
                let found = match_version(kind, v.canonical_form()).unwrap();
                assert_eq!(found.version(), v.version());
            }
            let newest = match_version(kind, kind.current().canonical_form()).unwrap();
            assert!(newest.is_current(), "{kind}");
        }
        // ReconcileCommand's v1 is not its v2.
        let v1 = RecordKind::ReconcileCommand.version(1).unwrap();
        let found = match_version(RecordKind::ReconcileCommand, v1.canonical_form()).unwrap();
        assert_eq!(found.version(), 1);
        assert!(!found.is_current());
        // Another record's schema is not a version of this one.
        assert!(
            match_version(
                RecordKind::ToolProposal,
                RecordKind::Approval.current().canonical_form()
            )
            .is_none()
        );
    }
}

//! Airlock with a real Confluent-compatible schema registry (Apicurio, started by the harness)
//! and a real broker: `airlock topics create` registers every schema version under its subject
//! with BACKWARD compatibility (a second run registers nothing), the registry refuses an
//! incompatible change, a processor refuses to start before the subjects exist, and once they
//! do it decides Confluent-framed proposals exactly as single-object ones, while a Confluent
//! payload whose id is none of Airlock's schemas is dead-lettered with its reason. With
//! `schema_registry.framing = "confluent"` it writes decisions and journal events with the
//! registry's ids, and `airlock propose` and `airlock replay` read them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use airlock_processor::runtime::config::OutputFraming;
use airlock_processor::runtime::schema_registry::{self, Client};
use airlock_processor::runtime::wire::{Admit, header};
use airlock_processor::sample;
use airlock_schemas::{Codec, Decision, RecordKind, SchemaIds, ToolProposal};
use airlock_tests::airlock::{Airlock, InProcess, Options};
use airlock_tests::eventually;
use airlock_tests::registry::Registry;
use airlock_tests::typescript;
use airlock_tests::wall_ms;
use airlock_tests::workload::{self, Lcg};
use airlock_tests::{pytest, pytest_passes};

const WAIT: Duration = Duration::from_secs(60);

/// Runs blocking registry calls off the async runtime (the client is blocking).
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    tokio::task::spawn_blocking(f).await?
}

/// The subjects the registry lists.
async fn listed_subjects(url: &str) -> anyhow::Result<Vec<String>> {
    let url = format!("{url}/subjects");
    let out = tokio::process::Command::new("curl")
        .args(["-s", "-m", "10", "--fail", &url])
        .output()
        .await?;
    anyhow::ensure!(out.status.success(), "GET {url}: {out:?}");
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// Every decision replying to a proposal, by proposal id, without what differs between two
/// runs of the same inputs (the decision time).
fn comparable(replies: BTreeMap<String, Decision>) -> BTreeMap<String, Decision> {
    replies
        .into_iter()
        .map(|(id, mut d)| {
            d.decided_at = 0;
            (id, d)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemas_are_registered_and_confluent_framed_inputs_are_decided_like_single_object()
-> anyhow::Result<()> {
    let registry = Registry::start().await?;
    let mut single = Airlock::start_with("registry-so", 2, Options::default()).await?;
    let mut confluent = single
        .alongside("registry-cf", 2, Options::default())
        .await?;
    single.config.schema_registry.url = registry.url.clone();
    confluent.config.schema_registry.url = registry.url.clone();

    // Before the subjects exist, a processor with the registry refuses to start.
    let early = confluent.spawn("early")?;
    eventually("the processor without subjects to stop", WAIT, async || {
        Ok((!early.is_running()).then_some(()))
    })
    .await?;
    let refused = early.stop().expect_err("no subjects yet").to_string();
    eprintln!("a processor before the subjects exist: {refused}");
    assert!(
        refused.contains("is missing") && refused.contains("airlock topics create"),
        "{refused}"
    );

    // `airlock topics create` registers every version, oldest first, under BACKWARD.
    let (ok, out, err) = confluent.cli(&["topics", "create"])?;
    assert!(ok, "topics create failed: {err}\n{out}");
    eprintln!("airlock topics create:\n{out}");
    let proposals_subject = format!("{}-value", confluent.names.proposals());
    assert!(
        out.lines().any(|l| l
            .starts_with(&format!("schema   {proposals_subject} (BACKWARD): v1 id"))
            && l.ends_with("(new)")),
        "{out}"
    );
    let reconcile = RecordKind::ReconcileCommand.full_name();
    assert!(
        out.lines()
            .any(|l| l.contains(reconcile) && l.contains(" v1 id ") && l.contains(" v2 id ")),
        "{out}"
    );
    let subjects = listed_subjects(&registry.url).await?;
    for subject in schema_registry::subjects(&confluent.names) {
        assert!(
            subjects.contains(&subject.name),
            "{subject:?} in {subjects:?}"
        );
    }
    let url = registry.url.clone();
    let names = confluent.names.clone();
    let (reconcile_versions, levels) = blocking(move || {
        let client = Client::new(&url)?;
        let versions = client.versions(reconcile)?;
        let mut levels = Vec::new();
        for subject in schema_registry::subjects(&names) {
            levels.push((subject.name.clone(), client.compatibility(&subject.name)?));
        }
        Ok((versions, levels))
    })
    .await?;
    assert_eq!(reconcile_versions, Some(vec![1, 2]));
    for (subject, level) in levels {
        assert_eq!(level.as_deref(), Some("BACKWARD"), "{subject}");
    }

    // A second run registers nothing.
    let (ok, again, err) = confluent.cli(&["topics", "create"])?;
    assert!(ok, "{err}");
    eprintln!("airlock topics create, again:\n{again}");
    assert!(!again.contains("(new)"), "{again}");
    assert!(again.contains(" v1 id "), "{again}");
    let (ok, out, err) = single.cli(&["topics", "create"])?;
    assert!(ok, "{err}\n{out}");

    // An incompatible change (a new field without a default) is refused with the registry's
    // message; a schema that is none of Airlock's goes in under a subject of its own.
    let mut avsc: serde_json::Value = serde_json::from_str(RecordKind::ToolProposal.avsc())?;
    avsc["fields"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"name": "must_have", "type": "string"}));
    let url = registry.url.clone();
    let subject = proposals_subject.clone();
    let (refusal, versions, proposal_id, foreign_id) = blocking(move || {
        let client = Client::new(&url)?;
        let refusal = client
            .register(&subject, &avsc.to_string())
            .expect_err("incompatible");
        let versions = client.versions(&subject)?;
        let (proposal_id, _) = client.version(&subject, 1)?;
        let foreign = r#"{"type":"record","name":"Foreign","namespace":"elsewhere","fields":[{"name":"x","type":"long"}]}"#;
        let foreign_id = client.register("elsewhere-value", foreign)?;
        Ok((format!("{refusal:#}"), versions, proposal_id, foreign_id))
    })
    .await?;
    eprintln!("an incompatible change: {refusal}");
    assert!(
        refusal.contains("HTTP 409") && refusal.contains("ncompatible"),
        "{refusal}"
    );
    assert_eq!(versions, Some(vec![1]));
    assert_ne!(proposal_id, foreign_id);

    // The same proposals to both: single-object to one, Confluent-framed with the registry's
    // id to the other; then a Confluent payload with the foreign schema's id, and one with an
    // id the registry never gave. The second writes its decisions and journal in the
    // Confluent framing too.
    confluent.config.schema_registry.framing = OutputFraming::Confluent;
    let p_single = single.spawn("p1")?;
    let p_confluent = confluent.spawn("p1")?;
    let proposals: Vec<ToolProposal> = workload::proposals(24, wall_ms(), &mut Lcg(7));
    let producer = single.producer()?;
    single
        .send_many(&producer, &single.names.proposals(), &proposals, |p| {
            p.operation_key.as_str()
        })
        .await?;
    let codec =
        Codec::new().with_schema_ids(SchemaIds::new().with(proposal_id, RecordKind::ToolProposal)?);
    let topic = confluent.names.proposals();
    for p in &proposals {
        let payload = codec.encode_confluent(p)?;
        assert_eq!(payload[0], 0);
        assert_eq!(payload[1..5], proposal_id.to_be_bytes());
        confluent
            .send_raw(
                &producer,
                &topic,
                Some(p.operation_key.as_bytes()),
                &payload,
            )
            .await?;
    }
    let mut foreign = vec![0u8];
    foreign.extend(foreign_id.to_be_bytes());
    foreign.push(42); // the datum: a long 21
    confluent
        .send_raw(&producer, &topic, Some(b"refund:foreign"), &foreign)
        .await?;
    let mut never = vec![0u8];
    never.extend(987_654_321u32.to_be_bytes());
    never.extend(&codec.encode_confluent(&proposals[0])?[5..]);
    confluent
        .send_raw(&producer, &topic, Some(b"refund:never"), &never)
        .await?;

    let distinct: std::collections::BTreeSet<&str> =
        proposals.iter().map(|p| p.proposal_id.as_str()).collect();
    let expected = eventually("every single-object proposal answered", WAIT, async || {
        let r = single.proposal_replies()?;
        Ok((r.len() >= distinct.len()).then_some(r))
    })
    .await?;
    let got = eventually(
        "every Confluent-framed proposal answered",
        WAIT,
        async || {
            let r = confluent.proposal_replies()?;
            Ok((r.len() >= distinct.len()).then_some(r))
        },
    )
    .await?;
    assert_eq!(expected.len(), distinct.len());
    assert_eq!(comparable(got), comparable(expected));
    // Both dispatched the same commands.
    let keys = |a: &Airlock| -> anyhow::Result<Vec<(String, i64)>> {
        let mut k: Vec<_> = a
            .dispatches()?
            .into_iter()
            .map(|d| (d.operation_key, d.epoch))
            .collect();
        k.sort();
        Ok(k)
    };
    assert_eq!(keys(&confluent)?, keys(&single)?);
    assert!(!keys(&single)?.is_empty());

    let dlq = eventually("2 dead letters", WAIT, async || {
        let r = confluent.read_topic(&confluent.names.dlq())?;
        let r: Vec<_> = r.into_iter().filter(|r| r.admit == Admit::Accept).collect();
        Ok((r.len() >= 2).then_some(r))
    })
    .await?;
    assert_eq!(dlq.len(), 2, "{dlq:?}");
    for record in &dlq {
        let id = match record.key.as_deref() {
            Some(b"refund:foreign") => foreign_id,
            Some(b"refund:never") => 987_654_321,
            other => panic!("unexpected dead letter {other:?}: {record:?}"),
        };
        assert_eq!(
            record.header_str(header::DLQ_REASON),
            Some("UNKNOWN_SCHEMA")
        );
        let detail = record.header_str(header::DLQ_DETAIL).unwrap_or_default();
        assert!(
            detail.contains(&format!("Confluent schema id {id} ")),
            "{detail}"
        );
    }
    assert!(
        single
            .read_topic(&single.names.dlq())?
            .iter()
            .all(|r| r.admit != Admit::Accept)
    );

    // What the second wrote for others to read carries the registry's ids of the current
    // Decision and JournalEvent schemas; the first wrote single-object.
    let config = confluent.config.clone();
    let names = confluent.names.clone();
    let ids = blocking(move || {
        schema_registry::configured_ids(&config, &schema_registry::subjects(&names))
    })
    .await?;
    for (topic, kind, framed) in [
        (confluent.names.decisions(), RecordKind::Decision, true),
        (confluent.names.journal(), RecordKind::JournalEvent, true),
        (single.names.decisions(), RecordKind::Decision, false),
    ] {
        let owner = if framed { &confluent } else { &single };
        let records: Vec<_> = owner
            .read_topic(&topic)?
            .into_iter()
            .filter(|r| r.admit == Admit::Accept && r.value.is_some())
            .collect();
        assert!(!records.is_empty(), "{topic}");
        let id = ids.id_of(kind).expect("the current schema has an id");
        for r in &records {
            let value = r.value.as_deref().unwrap_or_default();
            if framed {
                assert_eq!(value.first(), Some(&0u8), "{topic}: {r:?}");
                assert_eq!(value.get(1..5), Some(&id.to_be_bytes()[..]), "{topic}");
            } else {
                assert_eq!(value.get(..2), Some(&[0xc3u8, 0x01][..]), "{topic}: {r:?}");
            }
        }
    }
    // Airlock's own readers take the Confluent framing: `airlock propose` publishes in it and
    // reads its answer, `airlock replay` verifies the journal.
    let arguments = sample::money_arguments("acme", "acct-7", 700, "EUR");
    let (ok, out, err) = confluent.cli(&[
        "propose",
        "--tool",
        "refund",
        "--operation-key",
        "refund:cli-confluent",
        "--arguments",
        &arguments,
        "--tenant",
        "acme",
        "--principal",
        "agent-support-1",
        "--run-id",
        "run-cli-confluent",
    ])?;
    eprintln!("airlock propose with confluent framing:\n{out}\n{err}");
    assert!(
        ok && out.lines().any(|l| l.starts_with("refund:cli-confluent ")),
        "{out}\n{err}"
    );
    let cli_proposal = confluent
        .read_topic(&topic)?
        .into_iter()
        .find(|r| r.key.as_deref() == Some(b"refund:cli-confluent".as_slice()))
        .expect("the CLI's proposal");
    assert_eq!(
        cli_proposal.value.as_deref().and_then(|v| v.get(..5)),
        Some(&[&[0u8][..], &proposal_id.to_be_bytes()[..]].concat()[..])
    );
    let (ok, out, err) = confluent.cli(&["replay"])?;
    assert!(ok && out.contains("0 findings"), "{out}\n{err}");

    p_single.stop()?;
    p_confluent.stop()?;
    Ok(())
}

/// The Python client looks its schema id up in the registry and publishes Confluent-framed
/// proposals, which the processor decides, answering in the Confluent framing that the client
/// reads (`clients/python/tests/registry`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_publishes_in_confluent_framing_with_the_registry_id()
-> anyhow::Result<()> {
    let registry = Registry::start().await?;
    let (a, processor, proposal_id) = framed_airlock("registry-py", &registry).await?;

    let mut tests = pytest("registry")?;
    tests
        .env("AIRLOCK_TEST_BROKERS", &a.config.kafka.brokers)
        .env("AIRLOCK_TEST_PREFIX", &a.config.topics.prefix)
        .env("AIRLOCK_TEST_SCHEMA_REGISTRY", &registry.url)
        .env("AIRLOCK_TEST_PROPOSAL_SCHEMA_ID", proposal_id.to_string());
    pytest_passes(
        tests,
        Duration::from_secs(180),
        "the Python client's registry tests",
    )
    .await?;

    assert_answered_in_confluent_framing(&a, proposal_id, 1).await?;
    processor.stop()?;
    Ok(())
}

/// What the clients' registry tests run against: an Airlock of its own with `registry`, its
/// topics created (which registers the schemas), answering in the Confluent framing, with one
/// processor running; and the registry's id of the ToolProposal schema, which the clients
/// must find and publish with.
async fn framed_airlock(
    test: &str,
    registry: &Registry,
) -> anyhow::Result<(Airlock, InProcess, u32)> {
    let mut a = Airlock::start_with(test, 2, Options::default()).await?;
    a.config.schema_registry.url = registry.url.clone();
    a.config.schema_registry.framing = OutputFraming::Confluent;
    let (ok, out, err) = a.cli(&["topics", "create"])?;
    anyhow::ensure!(ok, "topics create failed: {err}\n{out}");
    let url = registry.url.clone();
    let subject = format!("{}-value", a.names.proposals());
    let (proposal_id, _) = blocking(move || Client::new(&url)?.version(&subject, 1)).await?;
    let processor = a.spawn("p1")?;
    Ok((a, processor, proposal_id))
}

/// At least `at_least` proposals were published, each in the Confluent wire format with the
/// registry's id `proposal_id`, and each answered, in the Confluent framing.
async fn assert_answered_in_confluent_framing(
    a: &Airlock,
    proposal_id: u32,
    at_least: usize,
) -> anyhow::Result<()> {
    let published = a.read_topic(&a.names.proposals())?;
    assert!(published.len() >= at_least, "{published:?}");
    let codec =
        Codec::new().with_schema_ids(SchemaIds::new().with(proposal_id, RecordKind::ToolProposal)?);
    let replies = a.proposal_replies()?;
    for r in &published {
        let value = r.value.as_deref().unwrap_or_default();
        assert_eq!(value.first(), Some(&0u8), "{r:?}");
        assert_eq!(
            value.get(1..5),
            Some(&proposal_id.to_be_bytes()[..]),
            "{r:?}"
        );
        let proposal: ToolProposal = codec.decode_confluent(value)?;
        assert!(
            replies.contains_key(&proposal.proposal_id),
            "{proposal:?} unanswered"
        );
    }
    assert_decisions_framed(a).await
}

/// Every decision `a`'s processor wrote is in the Confluent framing with the registry's id of
/// the current Decision schema (what the clients' tests read their answers from).
async fn assert_decisions_framed(a: &Airlock) -> anyhow::Result<()> {
    let config = a.config.clone();
    let names = a.names.clone();
    let ids = blocking(move || {
        schema_registry::configured_ids(&config, &schema_registry::subjects(&names))
    })
    .await?;
    let id = ids.id_of(RecordKind::Decision).expect("a Decision id");
    let decisions: Vec<_> = a
        .read_topic(&a.names.decisions())?
        .into_iter()
        .filter(|r| r.admit == Admit::Accept && r.value.is_some())
        .collect();
    assert!(!decisions.is_empty());
    for r in &decisions {
        let value = r.value.as_deref().unwrap_or_default();
        assert_eq!(value.first(), Some(&0u8), "{r:?}");
        assert_eq!(value.get(1..5), Some(&id.to_be_bytes()[..]), "{r:?}");
    }
    Ok(())
}

/// The TypeScript client looks its schema id up in the registry and publishes Confluent-framed
/// proposals, which the processor decides, answering in the Confluent framing that the client
/// reads (`clients/typescript/test/integration/registry.test.ts`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typescript_client_publishes_in_confluent_framing_with_the_registry_id()
-> anyhow::Result<()> {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let package = blocking(move || typescript::package(&root)).await?;
    let registry = Registry::start().await?;
    let (a, processor, proposal_id) = framed_airlock("registry-ts", &registry).await?;

    let mut node = typescript::node_test(&package);
    node.arg("dist/test/integration/registry.test.js")
        .env("AIRLOCK_TEST_BROKERS", &a.config.kafka.brokers)
        .env("AIRLOCK_TEST_PREFIX", &a.config.topics.prefix)
        .env("AIRLOCK_TEST_SCHEMA_REGISTRY", &registry.url)
        .env("AIRLOCK_TEST_PROPOSAL_SCHEMA_ID", proposal_id.to_string())
        .stdin(std::process::Stdio::null());
    let out = blocking(move || Ok(node.output()?)).await?;
    typescript::assert_all_passed(
        &out,
        "the TypeScript client's registry tests",
        &registry.log(),
    );

    assert_answered_in_confluent_framing(&a, proposal_id, 3).await?;
    processor.stop()?;
    Ok(())
}

//! `airlock receipts verify`: reads the receipt chains (DESIGN.md section 8) from the receipts
//! topic, every partition or some, or from a file written by `--export`, and names the first
//! break of each partition (see `receipt::verify`). Exits non-zero when a chain is broken.
//!
//! The topic is read up to its end when the check starts (a barrier record written then, or the
//! high watermark with `--read-only`; see `runtime::scan`), so a running processor does not
//! keep the check from ending. Signatures are checked against `--public-key` files (several
//! for a key rotation), else against the public half of `receipts.signing_key_file`.
//!
//! The export is JSON lines, one record each: `{"partition", "offset", "headers": [[name,
//! value], ...], "value": "<hex>"}`, so an auditor can verify offline what was read.

use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use rdkafka::consumer::Consumer;
use rdkafka::message::Headers;
use serde::{Deserialize, Serialize};

use crate::capability::{self, VerifyingKey};
use crate::receipt::verify::{Read, Report, Verifier};
use crate::runtime::config::Config;
use crate::runtime::scan::{Scanned, Scanner};
use crate::runtime::topics::Names;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Check the receipt chains: sequence without gaps, each receipt's hash, its link to the
    /// one before and its signature; name the first break per partition, exit non-zero on one.
    Verify(VerifyArgs),
}

#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// The configuration file (brokers, topic prefix, receipts key); see
    /// deploy/config/airlock.toml.
    #[arg(long, short, env = "AIRLOCK_CONFIG")]
    pub config: Option<PathBuf>,
    /// A trusted verifying key file (`<prefix>.pub` of `airlock keygen`); repeat it for a key
    /// rotation. Default: the public half of receipts.signing_key_file.
    #[arg(long = "public-key")]
    pub public_keys: Vec<PathBuf>,
    #[command(flatten)]
    pub partitions: super::replay::PartitionArgs,
    /// Read this topic instead of `<prefix>receipts` (a copy, a mirror).
    #[arg(long)]
    pub topic: Option<String>,
    /// Read the records from this file (written by `--export`) instead of from Kafka.
    #[arg(long, conflicts_with = "topic")]
    pub file: Option<PathBuf>,
    /// Also write every record read to this file (JSON lines), to verify it again offline.
    #[arg(long)]
    pub export: Option<PathBuf>,
    /// Print progress to standard error at most this often, in seconds (0: never).
    #[arg(long, default_value_t = 2)]
    pub progress_seconds: u64,
    /// Write nothing: end at each partition's high watermark instead of at a barrier record
    /// written now (see `runtime::compat` on brokers whose watermark lags).
    #[arg(long)]
    pub read_only: bool,
    /// Give up when a partition yields nothing for this long, in seconds.
    #[arg(long, default_value_t = 30)]
    pub stall_timeout_seconds: u64,
}

/// One record in an export file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exported {
    pub partition: i32,
    pub offset: i64,
    pub headers: Vec<(String, String)>,
    /// The record's value in hex; absent for a record without one.
    pub value: Option<String>,
}

pub fn run(args: &Args, out: &mut impl Write) -> anyhow::Result<()> {
    match &args.command {
        Command::Verify(verify) => run_verify(verify, out),
    }
}

fn run_verify(args: &VerifyArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let config = Config::load(args.config.as_deref()).context("loading the configuration")?;
    let keys = trusted_keys(args, &config)?;
    let mut verifier =
        Verifier::new(keys).with_codec(crate::runtime::schema_registry::reader_codec(&config)?);
    let mut export = match &args.export {
        Some(path) => Some(BufWriter::new(
            std::fs::File::create(path)
                .with_context(|| format!("creating the export file {}", path.display()))?,
        )),
        None => None,
    };
    let mut progress = Progress::new(args.progress_seconds);
    let wanted = |p: i32| args.partitions.includes(p);
    let mut feed = |record: Exported| -> anyhow::Result<()> {
        if !wanted(record.partition) {
            return Ok(());
        }
        let headers: Vec<(String, Vec<u8>)> = record
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone().into_bytes()))
            .collect();
        let value = record
            .value
            .as_deref()
            .map(hex::decode)
            .transpose()
            .with_context(|| {
                format!(
                    "partition {} offset {}: the value is not hex",
                    record.partition, record.offset
                )
            })?;
        verifier.observe(&Read {
            partition: record.partition,
            offset: record.offset,
            headers: &headers,
            value: value.as_deref(),
        });
        if let Some(export) = &mut export {
            serde_json::to_writer(&mut *export, &record)?;
            export.write_all(b"\n")?;
        }
        progress.tick(verifier.records());
        Ok(())
    };
    let (source, partitions) = match &args.file {
        Some(path) => {
            read_file(path, &mut feed)?;
            (path.display().to_string(), Vec::new())
        }
        None => {
            let topic = args
                .topic
                .clone()
                .unwrap_or_else(|| Names::new(&config.topics.prefix).receipts());
            let partitions = read_topic(&config, &topic, args, &mut feed)?;
            (topic, partitions)
        }
    };
    // An empty partition is reported too (as having no receipts).
    for p in partitions {
        verifier.include(p);
    }
    if let Some(mut export) = export {
        export.flush()?;
    }
    let report = verifier.finish();
    writeln!(out, "receipts of {source}:")?;
    writeln!(out, "{report}")?;
    check(&report)
}

fn check(report: &Report) -> anyhow::Result<()> {
    let broken: Vec<String> = report
        .partitions
        .iter()
        .filter_map(|p| {
            p.first_break
                .as_ref()
                .map(|b| format!("partition {}: {}", p.partition, b.name()))
        })
        .collect();
    anyhow::ensure!(
        broken.is_empty(),
        "the receipt chain is broken ({})",
        broken.join(", ")
    );
    Ok(())
}

fn trusted_keys(args: &VerifyArgs, config: &Config) -> anyhow::Result<Vec<VerifyingKey>> {
    if !args.public_keys.is_empty() {
        return args
            .public_keys
            .iter()
            .map(|path| {
                capability::load_verifying_key(path)
                    .with_context(|| format!("loading the verifying key {}", path.display()))
            })
            .collect();
    }
    let secret = &config.receipts.signing_key_file;
    anyhow::ensure!(
        !secret.as_os_str().is_empty(),
        "no key to check signatures with: pass --public-key, or configure \
         receipts.signing_key_file"
    );
    let key = capability::load_signing_key(secret).context("loading the receipts signing key")?;
    Ok(vec![key.verifying_key()])
}

fn read_file(
    path: &Path,
    feed: &mut impl FnMut(Exported) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let file = std::fs::File::open(path)
        .with_context(|| format!("opening the export file {}", path.display()))?;
    for (n, line) in BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("reading {}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let record: Exported = serde_json::from_str(&line)
            .with_context(|| format!("{} line {}", path.display(), n + 1))?;
        feed(record)?;
    }
    Ok(())
}

/// Reads `topic` partition by partition to its end (a barrier record's offset, or the high
/// watermark with `--read-only`; see `runtime::scan`), feeding every record but barriers.
fn read_topic(
    config: &Config,
    topic: &str,
    args: &VerifyArgs,
    feed: &mut impl FnMut(Exported) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<i32>> {
    let consumer = super::replay::reader(config, "receipts-verify")?;
    let scanner = Scanner {
        consumer: &consumer,
        stall_timeout: Duration::from_secs(args.stall_timeout_seconds.max(1)),
    };
    let metadata = consumer
        .fetch_metadata(Some(topic), scanner.stall_timeout)
        .with_context(|| format!("reading the metadata of {topic} (is the broker up?)"))?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic && t.error().is_none())
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .filter(|&p| args.partitions.includes(p))
        .collect();
    anyhow::ensure!(
        !partitions.is_empty(),
        "topic {topic} does not exist or has none of the partitions asked for"
    );
    let wanted: Vec<(String, i32)> = partitions.iter().map(|&p| (topic.to_owned(), p)).collect();
    let ends = super::replay::ends(&scanner, config, args.read_only, &wanted, None)?;
    for (&p, bounds) in partitions.iter().zip(ends) {
        scanner.scan(topic, p, bounds, |s: Scanned<'_>| -> anyhow::Result<()> {
            let headers = s
                .headers
                .map(|hs| {
                    hs.iter()
                        .map(|h| {
                            (
                                h.key.to_owned(),
                                String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            feed(Exported {
                partition: p,
                offset: s.offset,
                headers,
                value: s.payload.map(hex::encode),
            })
        })?;
    }
    Ok(partitions)
}

/// Progress lines on standard error, at most one per interval.
struct Progress {
    every: Option<Duration>,
    started: Instant,
    last: Instant,
}

impl Progress {
    fn new(seconds: u64) -> Self {
        let now = Instant::now();
        Progress {
            every: (seconds > 0).then_some(Duration::from_secs(seconds)),
            started: now,
            last: now,
        }
    }

    fn tick(&mut self, records: u64) {
        let Some(every) = self.every else {
            return;
        };
        if self.last.elapsed() < every {
            return;
        }
        self.last = Instant::now();
        let secs = self.started.elapsed().as_secs_f64();
        eprintln!(
            "receipts: {records} records read in {secs:.0} s ({:.0} per second)",
            records as f64 / secs.max(0.001)
        );
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::receipt::tests::{chain, key};
    use crate::runtime::wire::{OutRecord, identity};
    use airlock_schemas::Codec;

    fn export(dir: &Path, receipts: &[airlock_schemas::Receipt]) -> PathBuf {
        let marker = OutRecord::fence_marker("airlock.receipts", 0, 1);
        let mut lines = vec![Exported {
            partition: 0,
            offset: 0,
            headers: text(&marker.headers),
            value: marker.value.as_deref().map(hex::encode),
        }];
        for (i, r) in receipts.iter().enumerate() {
            lines.push(Exported {
                partition: 0,
                offset: i as i64 + 1,
                headers: text(&identity("receipt", &format!("receipt/0/{i}"), 0, 1)),
                value: Some(hex::encode(Codec::new().encode_single_object(r).unwrap())),
            });
        }
        let path = dir.join("receipts.jsonl");
        let text: Vec<String> = lines
            .iter()
            .map(|l| serde_json::to_string(l).unwrap())
            .collect();
        std::fs::write(&path, text.join("\n") + "\n").unwrap();
        path
    }

    fn text(headers: &[(String, Vec<u8>)]) -> Vec<(String, String)> {
        headers
            .iter()
            .map(|(k, v)| (k.clone(), String::from_utf8(v.clone()).unwrap()))
            .collect()
    }

    fn args(dir: &Path, file: PathBuf) -> VerifyArgs {
        let public = dir.join("receipts.pub");
        std::fs::write(&public, hex::encode(key(7).verifying_key().to_bytes())).unwrap();
        VerifyArgs {
            config: None,
            public_keys: vec![public],
            partitions: Default::default(),
            topic: None,
            file: Some(file),
            export: None,
            progress_seconds: 0,
            read_only: false,
            stall_timeout_seconds: 1,
        }
    }

    #[test]
    fn an_exported_chain_verifies_and_a_dropped_receipt_fails_the_command() {
        let dir = tempfile::tempdir().unwrap();
        let receipts = chain(&key(7), 0, 4);
        let file = export(dir.path(), &receipts);
        let mut out = Vec::new();
        let mut ok = args(dir.path(), file);
        ok.export = Some(dir.path().join("again.jsonl"));
        run_verify(&ok, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("partition 0: OK, 4 receipts chained"),
            "{text}"
        );
        // The export is the same records: it verifies too.
        let again = args(dir.path(), dir.path().join("again.jsonl"));
        run_verify(&again, &mut Vec::new()).unwrap();

        let mut dropped = receipts.clone();
        dropped.remove(1);
        let file = export(dir.path(), &dropped);
        let mut out = Vec::new();
        let err = run_verify(&args(dir.path(), file), &mut out).unwrap_err();
        assert!(err.to_string().contains("partition 0: missing"), "{err}");
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("receipt 1 is missing"), "{text}");
    }
}

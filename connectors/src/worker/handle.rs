//! One command, start to finish (DESIGN.md section 7). For a dispatch:
//!
//! 1. refuse what must not run (dead letter, never an outcome): undecodable, misplaced,
//!    unsigned, forged, altered arguments, expired over an hour ago. An authentic command
//!    read less than an hour after its attempt deadline is not refused: it goes through steps
//!    2 and 3 like any other and then fails "not called" in step 4. Started and failed at
//!    once, the epoch can never run anywhere, so the processor settles it FAILED with proof
//!    now; refused without an outcome, it would wait out the attempt as UNKNOWN and cost a
//!    downstream lookup, which under a backlog (every command expiring in the queue)
//!    multiplies the load;
//! 2. refuse an epoch at or below one already started for the key (fence 2), and a command of
//!    an owner epoch behind the partition's fence (fence 1);
//! 3. produce `ATTEMPT_STARTED` and wait for its acknowledgement, then commit the dispatch
//!    offset synchronously: a worker that lost the partition fails here and calls nothing;
//! 4. call downstream once with `timeout = min(attempt_timeout_ms, attempt_deadline_at - now -
//!    reserve_ms)` (no time left: no call, FAILED "not called");
//! 5. produce COMMITTED, FAILED or UNKNOWN with bounded evidence.
//!
//! A reconcile command is a lookup by idempotency key, answered RECONCILED_COMMITTED,
//! RECONCILED_FAILED (proven absent) or RECONCILED_UNKNOWN; for an attempt this connector
//! started and failed before calling (learnt from the outcomes like the started epochs), it is
//! answered RECONCILED_FAILED without a lookup. Nothing is ever retried.
//!
//! Each command is handled in a span whose parent is the trace context of the dispatch record
//! (`traceparent`, written by the processor's decision): the outcomes and dead letters it
//! writes carry that span's context, so the processor's settlement joins the same trace, and
//! the downstream call carries it as its own `traceparent` header.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use airlock_processor::capability::Refused;
use airlock_processor::runtime::produce::{self, Producer};
use airlock_processor::telemetry::trace;
use airlock_schemas::{DispatchCommand, OutcomeKind, ReconcileCommand};
use opentelemetry::trace::TraceContextExt;
use opentelemetry::{Context, KeyValue};

use super::check::{Checker, Command};

/// How long after its attempt deadline an authentic dispatch command is still started and
/// failed "not called" rather than refused: an hour, far below the outcomes topic's retention
/// (the broker default, 7 days), so the attempt's ATTEMPT_STARTED, had it started, is still
/// there for the started map to refuse the copy.
const EXPIRED_FAILS_WITHIN_MS: i64 = 3_600_000;
use super::report::{self, Attempt, Reporter, Source};
use super::started::Started;
use super::telemetry::Telemetry;
use crate::http::{HttpConnector, Observation};

/// What handling a command may fail with: only the outcome or dead letter could not be
/// produced (the process stops; the processor's attempt deadline and reconciliation take over).
pub type Result<T, E = produce::Error> = std::result::Result<T, E>;

/// What became of one record, for the counters and the tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handled {
    DeadLettered,
    /// A redelivery of a started epoch, or a superseded epoch.
    Duplicate,
    /// Written by an owner behind the partition's fence.
    Fenced,
    /// Started, but the offset commit failed: not called.
    Abandoned,
    /// Called (or not, for lack of time or description) and reported.
    Executed(OutcomeKind),
    Reconciled(OutcomeKind),
}

/// Everything a command needs, shared by every partition of the worker.
#[derive(Debug)]
pub struct Handler {
    pub checker: Checker,
    pub reporter: Reporter,
    pub http: HttpConnector,
    pub producer: std::sync::Arc<Producer>,
    /// Drives the downstream calls (the producer has its own).
    pub runtime: tokio::runtime::Runtime,
    pub reserve_ms: i64,
    pub reconcile_timeout: Duration,
    /// Refusals and call durations.
    pub telemetry: std::sync::Arc<Telemetry>,
}

/// A record read from a dispatch partition, with the fence it was read under.
#[derive(Clone, Copy, Debug)]
pub struct Record<'a> {
    pub source: Source<'a>,
    /// The highest owner-epoch fence marker read on this partition so far.
    pub fence: i64,
    /// The trace context the record's headers carry (empty: the command starts a trace).
    pub parent: &'a Context,
}

pub fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Handler {
    /// Handles one accepted (not fenced by its header) record. `commit` commits the offset
    /// after it synchronously and says whether the group took it.
    pub fn handle(
        &self,
        record: Record<'_>,
        started: &mut Started,
        commit: impl FnOnce() -> bool,
    ) -> Result<Handled> {
        let source = record.source;
        let cx = self.span(
            format_args!("handle {} command", self.reporter.connector),
            source,
            record.parent,
        );
        // The command's own name, key and epoch, once it is known.
        let name = |verb: &str, tool: &str, key: &str, epoch: i64| {
            let span = cx.span();
            span.update_name(format!("{verb} {tool}"));
            span.set_attribute(KeyValue::new("airlock.operation_key", key.to_owned()));
            span.set_attribute(KeyValue::new("airlock.epoch", epoch));
        };
        let command = match self
            .checker
            .command(source.partition, source.key, source.payload)
        {
            Ok(c) => c,
            Err(refusal) => {
                self.dead_letter(&cx, source, refusal.reason, &refusal.detail)?;
                commit();
                return Ok(Handled::DeadLettered);
            }
        };
        let handled = match command {
            Command::Dispatch(cmd) => {
                name("execute", &cmd.tool, &cmd.operation_key, cmd.epoch);
                self.dispatch(&cx, record, &cmd, started, commit)
            }
            Command::Reconcile(cmd) => {
                name("reconcile", &cmd.tool, &cmd.operation_key, cmd.epoch);
                let handled = match self.checker.authorize_reconcile(&cmd) {
                    // A forged reconcile command must not be able to report a proof of
                    // failure for an attempt: it is dead-lettered, never answered.
                    Err(refused) => {
                        self.dead_letter(&cx, source, refused.code(), &refused.to_string())?;
                        Handled::DeadLettered
                    }
                    Ok(()) if cmd.owner_epoch < record.fence => {
                        log::warn!(
                            "{}#{} reconcile round {}: issued by owner epoch {} behind the \
                             fence {} of partition {}; ignored",
                            cmd.operation_key,
                            cmd.epoch,
                            cmd.round,
                            cmd.owner_epoch,
                            record.fence,
                            source.partition
                        );
                        Handled::Fenced
                    }
                    Ok(()) => self.reconcile(&cx, source.partition, &cmd, started)?,
                };
                commit();
                Ok(handled)
            }
        };
        if let Ok(Handled::Executed(kind) | Handled::Reconciled(kind)) = &handled {
            cx.span()
                .set_attribute(KeyValue::new("airlock.outcome", kind.as_str()));
        }
        cx.span().end();
        handled
    }

    fn dispatch(
        &self,
        cx: &Context,
        record: Record<'_>,
        cmd: &DispatchCommand,
        started: &mut Started,
        commit: impl FnOnce() -> bool,
    ) -> Result<Handled> {
        let source = record.source;
        let key = cmd.operation_key.as_str();
        let arguments = match self.checker.authorize(cmd, wall_ms()) {
            Ok(arguments) => Ok(arguments),
            // An authentic command of an attempt that already started is a redelivery, even
            // when it has expired since.
            Err(Refused::Expired { .. }) if started.refuses(key, cmd.epoch) => {
                log::info!("{key}#{}: redelivered after it started; ignored", cmd.epoch);
                commit();
                return Ok(Handled::Duplicate);
            }
            // Authentic, and too late to call: started and failed below without a call. Only
            // when it expired recently (a backlog): an old copy replayed could belong to an
            // attempt whose ATTEMPT_STARTED has left the outcomes topic since, and its FAILED
            // would then pass for proof; that one is refused as before.
            Err(Refused::Expired {
                attempt_deadline_at,
                now,
            }) if now - attempt_deadline_at <= EXPIRED_FAILS_WITHIN_MS => Err(format!(
                "expired: read {} ms after the attempt deadline",
                now - attempt_deadline_at
            )),
            Err(refused) => {
                self.dead_letter(cx, source, refused.code(), &refused.to_string())?;
                commit();
                return Ok(Handled::DeadLettered);
            }
        };
        if started.refuses(key, cmd.epoch) {
            log::info!(
                "{key}#{}: epoch {} already started here; refused (redelivery or superseded)",
                cmd.epoch,
                started.get(key).unwrap_or_default()
            );
            commit();
            return Ok(Handled::Duplicate);
        }
        // The header passed the fence; the signed owner epoch must too (a header can be
        // rewritten, the signature cannot).
        if cmd.owner_epoch < record.fence {
            log::warn!(
                "{key}#{}: issued by owner epoch {} behind the fence {} of partition {}; ignored",
                cmd.epoch,
                cmd.owner_epoch,
                record.fence,
                source.partition
            );
            commit();
            return Ok(Handled::Fenced);
        }
        let attempt = Attempt {
            operation_key: key,
            epoch: cmd.epoch,
            partition: source.partition,
            owner_epoch: cmd.owner_epoch,
            round: None,
        };
        let (_, mut started_record) =
            self.reporter
                .outcome(attempt, OutcomeKind::AttemptStarted, None, None, wall_ms());
        let context = trace::inject(cx);
        started_record.headers.extend(context.iter().cloned());
        self.producer.send_phased(&[started_record])?;
        started.record(key, cmd.epoch);
        if !commit() {
            log::error!(
                "{key}#{}: ATTEMPT_STARTED is recorded but the offset commit failed (this worker \
                 probably lost the partition): not calling; the attempt settles through \
                 reconciliation",
                cmd.epoch
            );
            return Ok(Handled::Abandoned);
        }
        let max_evidence = self.http.max_evidence();
        let began = Instant::now();
        let observation = match arguments.and_then(|arguments| {
            self.http
                .request(cmd, &arguments)
                .map_err(|why| why.to_string())
        }) {
            Err(why) => Observation::not_called(why, max_evidence),
            Ok(mut request) => {
                for (name, value) in &context {
                    if let (Ok(name), Ok(value)) = (
                        hyper::header::HeaderName::from_bytes(name.as_bytes()),
                        hyper::header::HeaderValue::from_bytes(value),
                    ) {
                        request.headers.push((name, value));
                    }
                }
                let now = wall_ms();
                let left = cmd.attempt_deadline_at - now - self.reserve_ms;
                let cap = if cmd.attempt_timeout_ms > 0 {
                    cmd.attempt_timeout_ms
                } else {
                    i64::MAX
                };
                let timeout = left.min(cap);
                if timeout <= 0 {
                    Observation::not_called(
                        format!(
                            "no time left: the attempt deadline is {} ms away and {} ms are \
                             reserved for reporting",
                            cmd.attempt_deadline_at - now,
                            self.reserve_ms
                        ),
                        max_evidence,
                    )
                } else {
                    log::info!(
                        "{key}#{}: started; calling {} {} (timeout {timeout} ms)",
                        cmd.epoch,
                        request.method,
                        request.url
                    );
                    let timeout = Duration::from_millis(timeout as u64);
                    self.runtime
                        .block_on(self.http.call(&cmd.tool, &request, timeout))
                }
            }
        };
        let kind = report::kind_of(&observation, false);
        if observation.was_not_called() {
            started.record_unsent(key, cmd.epoch);
        }
        self.telemetry
            .call_duration
            .observe(&["execute", kind.as_str()], began.elapsed().as_secs_f64());
        log::info!(
            "{key}#{}: {} after {} ms{}: {}",
            cmd.epoch,
            kind.as_str(),
            began.elapsed().as_millis(),
            observation
                .provider_reference
                .as_deref()
                .map(|r| format!(" (provider reference {r})"))
                .unwrap_or_default(),
            first_line(&observation.evidence)
        );
        let (_, mut outcome) = self.reporter.outcome(
            attempt,
            kind,
            Some(observation.evidence),
            observation.provider_reference,
            wall_ms(),
        );
        outcome.headers.extend(context);
        self.producer.send_phased(&[outcome])?;
        Ok(Handled::Executed(kind))
    }

    fn reconcile(
        &self,
        cx: &Context,
        partition: i32,
        cmd: &ReconcileCommand,
        started: &Started,
    ) -> Result<Handled> {
        let key = cmd.operation_key.as_str();
        let began = Instant::now();
        // An attempt this connector started and failed before any call (it expired in the
        // queue, typically, while the processor timed it out and asked): the answer is known,
        // and a lookup per such attempt is what turns a backlog into an overload.
        let observation = if started.failed_unsent(key, cmd.epoch) {
            Observation::not_called(
                format!(
                    "this connector failed attempt {} before calling downstream",
                    cmd.epoch
                ),
                self.http.max_evidence(),
            )
        } else {
            self.runtime
                .block_on(self.http.reconcile(cmd, self.reconcile_timeout))
        };
        let kind = report::kind_of(&observation, true);
        self.telemetry
            .call_duration
            .observe(&["reconcile", kind.as_str()], began.elapsed().as_secs_f64());
        log::info!(
            "{key}#{} reconcile round {}: {}: {}",
            cmd.epoch,
            cmd.round,
            kind.as_str(),
            first_line(&observation.evidence)
        );
        let attempt = Attempt {
            operation_key: key,
            epoch: cmd.epoch,
            partition,
            owner_epoch: cmd.owner_epoch,
            round: Some(cmd.round),
        };
        let (_, mut outcome) = self.reporter.outcome(
            attempt,
            kind,
            Some(observation.evidence),
            observation.provider_reference,
            wall_ms(),
        );
        outcome.headers.extend(trace::inject(cx));
        self.producer.send_phased(&[outcome])?;
        Ok(Handled::Reconciled(kind))
    }

    /// The span named `name` of handling the record at `source` (a child of `parent`, the
    /// record's trace), with the connector and worker as attributes.
    fn span(&self, name: std::fmt::Arguments<'_>, source: Source<'_>, parent: &Context) -> Context {
        trace::consume(
            name,
            source.topic,
            source.partition,
            source.offset,
            || {
                [
                    KeyValue::new("airlock.connector", self.reporter.connector.clone()),
                    KeyValue::new("airlock.worker_id", self.reporter.worker_id.clone()),
                ]
            },
            parent,
        )
    }

    /// Dead-letters a fence marker that did not verify (`refused`): it raises no fence.
    pub fn refuse_marker(
        &self,
        source: Source<'_>,
        parent: &Context,
        refused: &Refused,
        commit: impl FnOnce() -> bool,
    ) -> Result<Handled> {
        let cx = self.span(
            format_args!("refuse {} fence marker", self.reporter.connector),
            source,
            parent,
        );
        let detail = format!("fence marker: {refused}");
        self.dead_letter(&cx, source, refused.code(), &detail)?;
        commit();
        Ok(Handled::DeadLettered)
    }

    fn dead_letter(
        &self,
        cx: &Context,
        source: Source<'_>,
        reason: &str,
        detail: &str,
    ) -> Result<()> {
        self.telemetry.refused.inc(&[reason]);
        cx.span()
            .set_attribute(KeyValue::new("airlock.dead_letter", reason.to_owned()));
        log::warn!(
            "{} partition {} offset {}: refused {reason}: {detail}",
            source.topic,
            source.partition,
            source.offset
        );
        let mut record = self.reporter.dead_letter(source, reason, detail);
        record.headers.extend(trace::inject(cx));
        self.producer.send_phased(&[record])?;
        Ok(())
    }
}

fn first_line(text: &str) -> &str {
    let line = text.lines().next().unwrap_or("");
    match line.char_indices().nth(200) {
        Some((i, _)) => &line[..i],
        None => line,
    }
}

//! Commands, in two phases (DESIGN.md section 7). The worker reads what it has room for (at
//! most `connector.max_in_flight` commands started and not yet reported). Phase one
//! ([`Handler::prepare`]), record by record in the order read, for a dispatch:
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
//! 3. write `ATTEMPT_STARTED`.
//!
//! Then the worker produces the records read together (their `ATTEMPT_STARTED` and dead
//! letters) and waits for their acknowledgement, and commits the offsets past them
//! synchronously: when the commit fails (a worker that lost a partition, typically), none of
//! the calls read together is made; they settle through reconciliation. Phase
//! two ([`Handler::spawn`]) runs in the background while the worker reads on, each command on
//! its own (the commands of one operation key one after the other, in the order read):
//!
//! 4. call downstream once with `timeout = min(attempt_timeout_ms, attempt_deadline_at - now -
//!    reserve_ms)` (no time left: no call, FAILED "not called");
//! 5. produce COMMITTED, FAILED or UNKNOWN with bounded evidence as soon as the call ends.
//!
//! Records read together wait on the broker twice (their starts' acknowledgement, the commit)
//! whatever their number, and outcomes are acknowledged in the background, where one command
//! at a time paid three waits per command: under a burst that is what keeps commands from
//! expiring in the queue. A slow call holds one slot, not the worker: the other commands, of
//! every partition, go on.
//!
//! A reconcile command is a lookup by idempotency key, answered RECONCILED_COMMITTED,
//! RECONCILED_FAILED (proven absent) or RECONCILED_UNKNOWN; for an attempt this connector
//! started and failed before calling (learnt from the outcomes like the started epochs), it is
//! answered RECONCILED_FAILED without a lookup. It runs in phase two like a call, after the
//! commit, and is answered even when the commit failed; a worker that dies between the commit
//! and the answer costs the attempt one reconciliation round (the processor asks again at the
//! next). Nothing is ever retried.
//!
//! Each command is handled in a span whose parent is the trace context of the dispatch record
//! (`traceparent`, written by the processor's decision): the outcomes and dead letters it
//! writes carry that span's context, so the processor's settlement joins the same trace, and
//! the downstream call carries it as its own `traceparent` header.

use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use airlock_processor::capability::Refused;
use airlock_processor::runtime::clock::wall_ms;
use airlock_processor::runtime::produce::{self, Producer};
use airlock_processor::runtime::wire::OutRecord;
use airlock_processor::telemetry::trace;
use airlock_schemas::{DispatchCommand, OutcomeKind, ReconcileCommand};
use opentelemetry::trace::TraceContextExt;
use opentelemetry::{Context, KeyValue};

use super::check::{Checker, Command};
use super::report::{self, Attempt, Reporter, Source};
use super::started::Started;
use super::telemetry::Telemetry;
use crate::http::{HttpConnector, Observation};

/// How long after its attempt deadline an authentic dispatch command is still started and
/// failed "not called" rather than refused: an hour, far below the outcomes topic's retention
/// (the broker default, 7 days), so the attempt's ATTEMPT_STARTED, had it started, is still
/// there for the started map to refuse the copy.
const EXPIRED_FAILS_WITHIN_MS: i64 = 3_600_000;

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
    /// The runtime that runs the calls and lookups and waits for their outcomes'
    /// acknowledgements (owned by the worker's loop, which shuts it down before it lets go of
    /// the handler).
    pub runtime: tokio::runtime::Handle,
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

/// What phase one made of a record.
#[derive(Debug)]
pub enum Step {
    /// Nothing left to run (a dead letter, when there is one, is in the batch's records).
    Done(Handled),
    /// Started (a dispatch) or to answer (a reconcile command): runs once the batch's offsets
    /// are committed.
    Later(Box<Job>),
}

/// A command of the batch that calls downstream in phase two.
#[derive(Debug)]
pub struct Job {
    cx: Context,
    partition: i32,
    work: Work,
}

#[derive(Debug)]
enum Work {
    Call {
        cmd: Box<DispatchCommand>,
        /// The canonical arguments, or why the call cannot be made.
        arguments: std::result::Result<serde_json::Value, String>,
        /// The trace context the outcome and the downstream request carry.
        context: Vec<(String, Vec<u8>)>,
    },
    Lookup {
        cmd: ReconcileCommand,
        /// This connector started the attempt and failed it before calling.
        known_unsent: bool,
    },
}

impl Job {
    pub fn operation_key(&self) -> &str {
        match &self.work {
            Work::Call { cmd, .. } => &cmd.operation_key,
            Work::Lookup { cmd, .. } => &cmd.operation_key,
        }
    }

    /// True for a started dispatch (a call), false for a reconcile lookup.
    pub fn is_call(&self) -> bool {
        matches!(self.work, Work::Call { .. })
    }
}

/// What became of a spawned job, for the loop that counts them.
#[derive(Debug)]
pub struct Ended {
    pub operation_key: String,
    pub result: std::result::Result<Finished, Failed>,
}

/// A job that did not end with its outcome acknowledged: the worker stops.
#[derive(Debug, thiserror::Error)]
pub enum Failed {
    #[error(transparent)]
    Produce(#[from] produce::Error),
    #[error("the call task of {operation_key} failed: {why}")]
    Task { operation_key: String, why: String },
}

/// A job that ended: its outcome is acknowledged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finished {
    pub partition: i32,
    pub operation_key: String,
    pub epoch: i64,
    pub handled: Handled,
    /// A started attempt failed without a call.
    pub unsent: bool,
}

impl Handler {
    /// Phase one of an accepted (not fenced by its header) record: checks it, and starts it
    /// when it is a dispatch (its `ATTEMPT_STARTED` goes to `out`, as does a dead letter). The
    /// caller produces `out`, commits the offset past the record, and only then runs the
    /// returned job ([`Self::spawn`]).
    pub fn prepare(
        &self,
        record: Record<'_>,
        started: &mut Started,
        out: &mut Vec<OutRecord>,
    ) -> Step {
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
                out.push(self.dead_letter(&cx, source, refusal.reason, &refusal.detail));
                return done(&cx, Handled::DeadLettered);
            }
        };
        match command {
            Command::Dispatch(cmd) => {
                name("execute", &cmd.tool, &cmd.operation_key, cmd.epoch);
                self.start(cx, record, cmd, started, out)
            }
            Command::Reconcile(cmd) => {
                name("reconcile", &cmd.tool, &cmd.operation_key, cmd.epoch);
                match self.checker.authorize_reconcile(&cmd) {
                    // A forged reconcile command must not be able to report a proof of
                    // failure for an attempt: it is dead-lettered, never answered.
                    Err(refused) => {
                        out.push(self.dead_letter(
                            &cx,
                            source,
                            refused.code(),
                            &refused.to_string(),
                        ));
                        done(&cx, Handled::DeadLettered)
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
                        done(&cx, Handled::Fenced)
                    }
                    Ok(()) => {
                        let known_unsent = started.failed_unsent(&cmd.operation_key, cmd.epoch);
                        Step::Later(Box::new(Job {
                            cx,
                            partition: source.partition,
                            work: Work::Lookup { cmd, known_unsent },
                        }))
                    }
                }
            }
        }
    }

    fn start(
        &self,
        cx: Context,
        record: Record<'_>,
        cmd: Box<DispatchCommand>,
        started: &mut Started,
        out: &mut Vec<OutRecord>,
    ) -> Step {
        let source = record.source;
        let key = cmd.operation_key.as_str();
        let arguments = match self.checker.authorize(&cmd, wall_ms()) {
            Ok(arguments) => Ok(arguments),
            // An authentic command of an attempt that already started is a redelivery, even
            // when it has expired since.
            Err(Refused::Expired { .. }) if started.refuses(key, cmd.epoch) => {
                log::info!("{key}#{}: redelivered after it started; ignored", cmd.epoch);
                return done(&cx, Handled::Duplicate);
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
                out.push(self.dead_letter(&cx, source, refused.code(), &refused.to_string()));
                return done(&cx, Handled::DeadLettered);
            }
        };
        if started.refuses(key, cmd.epoch) {
            log::info!(
                "{key}#{}: epoch {} already started here; refused (redelivery or superseded)",
                cmd.epoch,
                started.get(key).unwrap_or_default()
            );
            return done(&cx, Handled::Duplicate);
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
            return done(&cx, Handled::Fenced);
        }
        let (_, mut started_record) = self.reporter.outcome(
            attempt_of(&cmd, source.partition),
            OutcomeKind::AttemptStarted,
            None,
            None,
            wall_ms(),
        );
        let context = trace::inject(&cx);
        started_record.headers.extend(context.iter().cloned());
        out.push(started_record);
        started.record(key, cmd.epoch);
        Step::Later(Box::new(Job {
            cx,
            partition: source.partition,
            work: Work::Call {
                cmd,
                arguments,
                context,
            },
        }))
    }

    /// A started call whose offset commit failed (this worker probably lost the partition):
    /// it is not made.
    pub fn abandon(&self, job: Job) -> Handled {
        if let Work::Call { cmd, .. } = &job.work {
            log::error!(
                "{}#{}: ATTEMPT_STARTED is recorded but the offset commit failed (this worker \
                 probably lost the partition): not calling; the attempt settles through \
                 reconciliation",
                cmd.operation_key,
                cmd.epoch
            );
        }
        job.cx.span().end();
        Handled::Abandoned
    }

    /// Phase two of one command: runs `job` (its offset committed) on the calls' runtime and
    /// produces its outcome as soon as the call (or lookup) ends; once the outcome is
    /// acknowledged, could not be produced, or the task panicked, `ended` hears of it (with
    /// the operation key, so that the next command of that key can start).
    pub fn spawn(self: &Arc<Self>, job: Job, ended: mpsc::Sender<Ended>) {
        let handler = self.clone();
        let key = job.operation_key().to_owned();
        let task = self.runtime.spawn(async move {
            let (finished, outcome) = handler.execute(job).await;
            let mut flight = handler.producer.send(&[&outcome])?;
            flight.acknowledged().await?;
            Ok(finished)
        });
        self.runtime.spawn(async move {
            let result = match task.await {
                Ok(result) => result.map_err(Failed::Produce),
                Err(e) => Err(Failed::Task {
                    operation_key: key.clone(),
                    why: e.to_string(),
                }),
            };
            // The loop left (a fatal error elsewhere) and no longer counts: nothing to tell.
            let _ = ended.send(Ended {
                operation_key: key,
                result,
            });
        });
    }

    /// One job: the call (or lookup) and the outcome record reporting it.
    async fn execute(&self, job: Job) -> (Finished, OutRecord) {
        let Job {
            cx,
            partition,
            work,
        } = job;
        let began = Instant::now();
        let (finished, outcome) = match work {
            Work::Call {
                cmd,
                arguments,
                context,
            } => {
                let observation = self.call(&cmd, arguments, &context).await;
                let kind = report::kind_of(&observation, false);
                self.telemetry
                    .call_duration
                    .observe(&["execute", kind.as_str()], began.elapsed().as_secs_f64());
                log::info!(
                    "{}#{}: {} after {} ms{}: {}",
                    cmd.operation_key,
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
                let unsent = observation.was_not_called();
                let (_, mut outcome) = self.reporter.outcome(
                    attempt_of(&cmd, partition),
                    kind,
                    Some(observation.evidence),
                    observation.provider_reference,
                    wall_ms(),
                );
                outcome.headers.extend(context);
                (
                    Finished {
                        partition,
                        operation_key: cmd.operation_key,
                        epoch: cmd.epoch,
                        handled: Handled::Executed(kind),
                        unsent,
                    },
                    outcome,
                )
            }
            Work::Lookup { cmd, known_unsent } => {
                let key = cmd.operation_key.as_str();
                // An attempt this connector started and failed before any call (it expired
                // in the queue, typically, while the processor timed it out and asked): the
                // answer is known, and a lookup per such attempt is what turns a backlog into
                // an overload.
                let observation = if known_unsent {
                    Observation::not_called(
                        format!(
                            "this connector failed attempt {} before calling downstream",
                            cmd.epoch
                        ),
                        self.http.max_evidence(),
                    )
                } else {
                    self.http.reconcile(&cmd, self.reconcile_timeout).await
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
                outcome.headers.extend(trace::inject(&cx));
                (
                    Finished {
                        partition,
                        operation_key: cmd.operation_key,
                        epoch: cmd.epoch,
                        handled: Handled::Reconciled(kind),
                        unsent: false,
                    },
                    outcome,
                )
            }
        };
        if let Handled::Executed(kind) | Handled::Reconciled(kind) = finished.handled {
            cx.span()
                .set_attribute(KeyValue::new("airlock.outcome", kind.as_str()));
        }
        cx.span().end();
        (finished, outcome)
    }

    /// Calls downstream once for a started dispatch, within its attempt deadline less the
    /// reserve and its attempt timeout cap; "not called" when it cannot be sent or no time
    /// is left.
    async fn call(
        &self,
        cmd: &DispatchCommand,
        arguments: std::result::Result<serde_json::Value, String>,
        context: &[(String, Vec<u8>)],
    ) -> Observation {
        let max_evidence = self.http.max_evidence();
        let mut request = match arguments.and_then(|arguments| {
            self.http
                .request(cmd, &arguments)
                .map_err(|why| why.to_string())
        }) {
            Err(why) => return Observation::not_called(why, max_evidence),
            Ok(request) => request,
        };
        for (name, value) in context {
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
            return Observation::not_called(
                format!(
                    "no time left: the attempt deadline is {} ms away and {} ms are reserved \
                     for reporting",
                    cmd.attempt_deadline_at - now,
                    self.reserve_ms
                ),
                max_evidence,
            );
        }
        log::info!(
            "{}#{}: started; calling {} {} (timeout {timeout} ms)",
            cmd.operation_key,
            cmd.epoch,
            request.method,
            request.url
        );
        let timeout = Duration::from_millis(timeout as u64);
        self.http.call(&cmd.tool, &request, timeout).await
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
        out: &mut Vec<OutRecord>,
    ) -> Step {
        let cx = self.span(
            format_args!("refuse {} fence marker", self.reporter.connector),
            source,
            parent,
        );
        let detail = format!("fence marker: {refused}");
        out.push(self.dead_letter(&cx, source, refused.code(), &detail));
        done(&cx, Handled::DeadLettered)
    }

    /// The dead letter of the record at `source`, refused for `reason`.
    fn dead_letter(
        &self,
        cx: &Context,
        source: Source<'_>,
        reason: &str,
        detail: &str,
    ) -> OutRecord {
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
        record
    }
}

/// Ends the span of a command finished in phase one.
fn done(cx: &Context, handled: Handled) -> Step {
    cx.span().end();
    Step::Done(handled)
}

/// The attempt a dispatch command starts.
fn attempt_of(cmd: &DispatchCommand, partition: i32) -> Attempt<'_> {
    Attempt {
        operation_key: &cmd.operation_key,
        epoch: cmd.epoch,
        partition,
        owner_epoch: cmd.owner_epoch,
        round: None,
    }
}

fn first_line(text: &str) -> &str {
    let line = text.lines().next().unwrap_or("");
    match line.char_indices().nth(200) {
        Some((i, _)) => &line[..i],
        None => line,
    }
}

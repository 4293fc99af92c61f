//! Sealed batches on their way to the broker: the outbox flush of DESIGN.md section 6,
//! pipelined. A sealed batch is first made durable (the fsync its seal deferred, see
//! `PartitionTask::seal_deferred`), then its outputs are sent; its changelog records follow
//! once every output of the batch is acknowledged, and its outbox rows are marked done once
//! the changelog is acknowledged. With a sender thread ([`Flights::with_sender`], what
//! `airlock run` uses) the fsync and the send happen there, in seal order, while the polling
//! thread reads and decides the next batches.
//!
//! Order is kept where it matters: nothing of a batch leaves before its outbox row is durable;
//! batches are synced and sent in seal order; a batch's changelog never leaves before its
//! outputs are acknowledged (a restore never holds state whose outputs could be missing),
//! changelogs leave in batch order, and batches complete in order. A crash loses nothing: every
//! record in flight is still in the outbox and is resent by the next claim (same identity;
//! readers deduplicate); a batch whose fsync the crash beat is lost together with every later
//! batch (the write-ahead log recovers a prefix), and none of them had left.
//!
//! Memory: at most `batch.max_in_flight` batches wait, those still at the sender included (the
//! caller waits for the oldest beyond that), each holding its records until acknowledged.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::mpsc::{self, TryRecvError};
use std::thread::JoinHandle;

use super::produce::{self, Acked, InFlight, Producer};
use super::wire::{OutRecord, Outbox};
use crate::store::{self, WalSync};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Produce(#[from] produce::Error),
    #[error("making a sealed batch durable before sending it: {0}")]
    Sync(#[source] store::Error),
    #[error("starting the sender thread: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("the sender thread stopped (after a failure reported earlier)")]
    Stopped,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One partition's share of a sealed batch.
pub type Sealed = (i32, Outbox);

/// A batch whose changelog the broker acknowledged: each task marks its outbox row done.
#[derive(Debug)]
pub struct Done {
    /// Per partition, the outbox row of what the batch sealed.
    pub rows: Vec<(i32, u64)>,
    /// Where the batch's changelog records landed.
    pub changelog: Acked,
}

#[derive(Debug)]
struct Batch {
    rows: Vec<(i32, u64)>,
    /// Sent once every output is acknowledged.
    changelog: Vec<OutRecord>,
    outputs: InFlight,
    changelog_flight: Option<InFlight>,
}

/// A sealed batch not yet durable or sent.
struct Job {
    unsynced: Vec<WalSync>,
    rows: Vec<(i32, u64)>,
    outputs: Vec<OutRecord>,
    changelog: Vec<OutRecord>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("unsynced", &self.unsynced.len())
            .field("outputs", &self.outputs.len())
            .field("changelog", &self.changelog.len())
            .finish()
    }
}

impl Job {
    /// The job of `sealed` (phase-0 outputs apart from the phase-1 changelog) and its record
    /// count.
    fn of(sealed: Vec<Sealed>, unsynced: Vec<WalSync>) -> (Job, usize) {
        let mut rows = Vec::with_capacity(sealed.len());
        let mut outputs = Vec::new();
        let mut changelog = Vec::new();
        let mut records = 0;
        for (p, outbox) in sealed {
            records += outbox.records.len();
            for r in outbox.records {
                if r.phase == 0 {
                    outputs.push(r);
                } else {
                    changelog.push(r);
                }
            }
            rows.push((p, outbox.row));
        }
        let job = Job {
            unsynced,
            rows,
            outputs,
            changelog,
        };
        (job, records)
    }

    /// Syncs the stores, then hands the outputs to the producer.
    fn run(self, producer: &Producer) -> Result<Batch> {
        sync_all(self.unsynced)?;
        let refs: Vec<&OutRecord> = self.outputs.iter().collect();
        let outputs = producer.send(&refs)?;
        Ok(Batch {
            rows: self.rows,
            changelog: self.changelog,
            outputs,
            changelog_flight: None,
        })
    }
}

/// fsyncs every store, side by side (separate databases, separate logs), and lets go of them:
/// a store's directory can be opened again once its last handle is gone.
fn sync_all(unsynced: Vec<WalSync>) -> Result<()> {
    let result = match unsynced.as_slice() {
        [] => Ok(()),
        [one] => one.sync(),
        [first, rest @ ..] => std::thread::scope(|scope| {
            let others: Vec<_> = rest.iter().map(|w| scope.spawn(|| w.sync())).collect();
            let mut result = first.sync();
            for other in others {
                let synced = other
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                result = result.and(synced);
            }
            result
        }),
    };
    drop(unsynced);
    result.map_err(Error::Sync)
}

/// The thread that syncs and sends batches in the order they were sealed.
#[derive(Debug)]
struct Sender {
    jobs: Option<mpsc::Sender<Job>>,
    sent: mpsc::Receiver<Result<Batch>>,
    /// Jobs handed over whose batch has not come back yet.
    queued: usize,
    thread: Option<JoinHandle<()>>,
}

impl Sender {
    fn start(producer: Arc<Producer>) -> Result<Sender> {
        let (jobs, inbox) = mpsc::channel::<Job>();
        let (outbox, sent) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("airlock-send".to_owned())
            .spawn(move || {
                for job in inbox {
                    let batch = job.run(&producer);
                    let failed = batch.is_err();
                    // After a failure nothing more leaves: the jobs still queued are dropped
                    // with `inbox` (their records stay in the outbox for the next claim).
                    if outbox.send(batch).is_err() || failed {
                        return;
                    }
                }
            })
            .map_err(Error::Spawn)?;
        Ok(Sender {
            jobs: Some(jobs),
            sent,
            queued: 0,
            thread: Some(thread),
        })
    }

    fn submit(&mut self, job: Job) -> Result<()> {
        let submitted = self.jobs.as_ref().map(|jobs| jobs.send(job));
        match submitted {
            Some(Ok(())) => {
                self.queued += 1;
                Ok(())
            }
            // The thread ended: the failure that ended it is waiting to be read.
            _ => Err(self.failure()),
        }
    }

    /// The failure the thread reported before it ended.
    fn failure(&mut self) -> Error {
        while let Ok(batch) = self.sent.try_recv() {
            if let Err(e) = batch {
                return e;
            }
        }
        Error::Stopped
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        // Closing the queue ends the thread once it is through what it holds.
        self.jobs = None;
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            log::error!("the sender thread panicked");
        }
    }
}

/// The batches in flight, oldest first.
#[derive(Debug, Default)]
pub struct Flights {
    batches: VecDeque<Batch>,
    /// Without one, batches are synced and sent on the calling thread.
    sender: Option<Sender>,
}

impl Flights {
    /// Flights whose batches are synced and sent on a thread of their own, in order, so that
    /// the caller goes on to the next batch at once.
    pub fn with_sender(producer: Arc<Producer>) -> Result<Self> {
        Ok(Flights {
            batches: VecDeque::new(),
            sender: Some(Sender::start(producer)?),
        })
    }

    /// Makes a sealed batch durable (`unsynced`: the fsyncs its seals deferred) and then sends
    /// its outputs (phase 0); its changelog (phase 1) follows their acknowledgement. With a
    /// sender thread both happen there and this returns at once. Returns the number of records
    /// the batch holds.
    pub fn send(
        &mut self,
        producer: &Producer,
        sealed: Vec<Sealed>,
        unsynced: Vec<WalSync>,
    ) -> Result<usize> {
        let (job, records) = Job::of(sealed, unsynced);
        match &mut self.sender {
            Some(sender) => sender.submit(job)?,
            None => {
                let batch = job.run(producer)?;
                self.batches.push_back(batch);
            }
        }
        Ok(records)
    }

    /// Takes over, in order, the batches the sender thread has synced and sent: those ready,
    /// or with `wait` at least one.
    fn collect(&mut self, wait: bool) -> Result<()> {
        let Some(sender) = self.sender.as_mut() else {
            return Ok(());
        };
        let mut wait = wait;
        while sender.queued > 0 {
            let batch = if wait {
                sender.sent.recv().map_err(|_| Error::Stopped)?
            } else {
                match sender.sent.try_recv() {
                    Ok(batch) => batch,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return Err(Error::Stopped),
                }
            };
            sender.queued -= 1;
            self.batches.push_back(batch?);
            wait = false;
        }
        Ok(())
    }

    /// Moves every batch as far as its acknowledgements allow, without waiting, then waits
    /// for the oldest batches until at most `keep` are left. Returns the completed batches,
    /// oldest first.
    pub fn advance(&mut self, producer: &Producer, keep: usize) -> Result<Vec<Done>> {
        let mut done = Vec::new();
        loop {
            self.collect(false)?;
            if self.batches.is_empty() {
                if self.len() <= keep {
                    return Ok(done);
                }
                // Every batch beyond `keep` is still at the sender.
                self.collect(true)?;
                continue;
            }
            let must_wait = self.len() > keep;
            // Changelogs leave in batch order, each after its batch's outputs.
            for (i, b) in self.batches.iter_mut().enumerate() {
                if b.changelog_flight.is_some() {
                    continue;
                }
                if must_wait && i == 0 {
                    b.outputs.wait(producer)?;
                } else if !b.outputs.poll()? {
                    break;
                }
                let refs: Vec<&OutRecord> = b.changelog.iter().collect();
                b.changelog_flight = Some(producer.send(&refs)?);
            }
            loop {
                let must_wait = self.len() > keep;
                let Some(front) = self.batches.front_mut() else {
                    break;
                };
                let Some(flight) = front.changelog_flight.as_mut() else {
                    break;
                };
                if must_wait {
                    flight.wait(producer)?;
                } else if !flight.poll()? {
                    break;
                }
                let b = self
                    .batches
                    .pop_front()
                    .expect("the front batch was just looked at");
                let changelog = b
                    .changelog_flight
                    .expect("the front batch's changelog was just sent")
                    .into_acked();
                done.push(Done {
                    rows: b.rows,
                    changelog,
                });
            }
            if self.len() <= keep {
                return Ok(done);
            }
        }
    }

    /// Batches in flight, those still at the sender thread included.
    pub fn len(&self) -> usize {
        self.batches.len() + self.sender.as_ref().map_or(0, |s| s.queued)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use rdkafka::ClientConfig;
    use rdkafka::mocking::MockCluster;

    use super::*;
    use crate::runtime::wire;
    use crate::store::{Backend, RocksBackend, RocksOptions};

    fn record(topic: &str, partition: i32, phase: u8, n: usize) -> OutRecord {
        OutRecord {
            topic: topic.to_owned(),
            partition,
            key: Some(format!("k{n}").into_bytes()),
            value: Some(vec![b'x'; 64]),
            headers: wire::identity("test", &n.to_string(), partition, 1),
            phase,
        }
    }

    fn mock_producer() -> (
        MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
        Arc<Producer>,
    ) {
        let cluster = MockCluster::new(1).expect("librdkafka's mock cluster starts");
        cluster
            .create_topic("out", 2, 1)
            .expect("mock topic out is created");
        cluster
            .create_topic("changelog", 2, 1)
            .expect("mock topic changelog is created");
        // Acknowledgements take a while, so batches really are in flight together.
        cluster
            .broker_round_trip_time(1, Duration::from_millis(20))
            .expect("the mock broker takes a round-trip time");
        let mut base = ClientConfig::new();
        base.set("bootstrap.servers", cluster.bootstrap_servers());
        let producer = Producer::new(&base, 1).expect("a producer on the mock cluster");
        (cluster, Arc::new(producer))
    }

    /// Six batches of two partitions, ten records each (three of them changelog), with at most
    /// two in flight; `unsynced(batch)` is what each batch's seal left to sync.
    fn six_batches(
        flights: &mut Flights,
        producer: &Producer,
        mut unsynced: impl FnMut(usize) -> Vec<WalSync>,
    ) -> Vec<Done> {
        let mut completed = Vec::new();
        for batch in 0..6 {
            let sealed: Vec<Sealed> = (0..2)
                .map(|p| {
                    let records = (0..10)
                        .map(|i| {
                            let phase = u8::from(i >= 7);
                            let topic = if phase == 0 { "out" } else { "changelog" };
                            record(topic, p, phase, batch * 10 + i)
                        })
                        .collect();
                    let row = (batch * 2) as u64 + p as u64;
                    (p, Outbox { row, records })
                })
                .collect();
            let sent = flights.send(producer, sealed, unsynced(batch)).unwrap();
            assert_eq!(sent, 20);
            completed.extend(flights.advance(producer, 2).unwrap());
            assert!(flights.len() <= 2);
        }
        completed.extend(flights.advance(producer, 0).unwrap());
        assert!(flights.is_empty());
        completed
    }

    /// Batches complete in order and each batch's changelog lands after the previous batch's,
    /// back to back.
    fn assert_in_order(completed: &[Done]) {
        assert_eq!(completed.len(), 6);
        for (batch, done) in completed.iter().enumerate() {
            let first = batch as u64 * 2;
            assert_eq!(done.rows, vec![(0, first), (1, first + 1)]);
            for p in 0..2 {
                let span = done.changelog.span("changelog", p).unwrap();
                assert_eq!(span.count, 3);
                assert!(span.is_contiguous());
                assert_eq!(span.lowest, batch as i64 * 3, "batch {batch} partition {p}");
            }
        }
    }

    /// On the calling thread: batches complete in order, at most `keep` stay in flight.
    #[test]
    fn batches_complete_in_order_with_their_changelogs_back_to_back() {
        let (_cluster, producer) = mock_producer();
        let mut flights = Flights::default();
        let completed = six_batches(&mut flights, &producer, |_| Vec::new());
        assert_in_order(&completed);
    }

    /// Through the sender thread, each batch first syncing two real RocksDB stores whose
    /// commits were deferred: the same order, the same bound (batches at the sender count),
    /// and once the flights are through, the sender holds no store open (the directory opens
    /// again) and the deferred writes are there.
    #[test]
    fn the_sender_thread_syncs_then_sends_in_seal_order() {
        let (_cluster, producer) = mock_producer();
        let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
        let mut stores: Vec<RocksBackend> = dirs
            .iter()
            .map(|d| RocksBackend::open(d.path(), &RocksOptions::default()).unwrap())
            .collect();
        let mut flights = Flights::with_sender(producer.clone()).unwrap();
        let completed = six_batches(&mut flights, &producer, |batch| {
            stores
                .iter_mut()
                .map(|store| {
                    let key = format!("batch{batch}").into_bytes();
                    store
                        .write_batch_deferred(vec![(key, Some(b"sealed".to_vec()))])
                        .unwrap()
                        .expect("a syncing store defers its fsync")
                })
                .collect()
        });
        assert_in_order(&completed);
        drop(stores);
        for dir in &dirs {
            let reopened = RocksBackend::open(dir.path(), &RocksOptions::default())
                .expect("no handle of the sender keeps the store open");
            for batch in 0..6 {
                let key = format!("batch{batch}").into_bytes();
                assert_eq!(reopened.get(&key).unwrap(), Some(b"sealed".to_vec()));
            }
        }
    }
}

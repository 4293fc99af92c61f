//! Sealed batches on their way to the broker: the outbox flush of DESIGN.md section 6,
//! pipelined. A batch's outputs are sent as soon as it is sealed (they are durable in the
//! RocksDB outbox by then), its changelog records once every output of the batch is
//! acknowledged, and its outbox rows are marked done once the changelog is acknowledged.
//! Meanwhile the next batches are read and decided.
//!
//! Order is kept where it matters: a batch's changelog never leaves before its outputs are
//! acknowledged (a restore never holds state whose outputs could be missing), changelogs
//! leave in batch order, and batches complete in order. A crash loses nothing: every record
//! in flight is still in the outbox and is resent by the next claim (same identity; readers
//! deduplicate).
//!
//! Memory: at most `batch.max_in_flight` batches wait (the caller waits for the oldest beyond
//! that), each holding its records until acknowledged.

use std::collections::VecDeque;

use super::produce::{self, Acked, InFlight, Producer};
use super::wire::{OutRecord, Outbox};

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

/// The batches in flight, oldest first.
#[derive(Debug, Default)]
pub struct Flights {
    batches: VecDeque<Batch>,
}

impl Flights {
    /// Sends a sealed batch's outputs (phase 0); its changelog (phase 1) follows their
    /// acknowledgement. Returns the number of records the batch holds.
    pub fn send(&mut self, producer: &Producer, sealed: Vec<Sealed>) -> produce::Result<usize> {
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
        let refs: Vec<&OutRecord> = outputs.iter().collect();
        let outputs = producer.send(&refs)?;
        self.batches.push_back(Batch {
            rows,
            changelog,
            outputs,
            changelog_flight: None,
        });
        Ok(records)
    }

    /// Moves every batch as far as its acknowledgements allow, without waiting, then waits
    /// for the oldest batches until at most `keep` are left. Returns the completed batches,
    /// oldest first.
    pub fn advance(&mut self, producer: &Producer, keep: usize) -> produce::Result<Vec<Done>> {
        let mut done = Vec::new();
        loop {
            let must_wait = self.batches.len() > keep;
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
                let must_wait = self.batches.len() > keep;
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
            if self.batches.len() <= keep {
                return Ok(done);
            }
        }
    }

    /// Batches in flight.
    pub fn len(&self) -> usize {
        self.batches.len()
    }

    pub fn is_empty(&self) -> bool {
        self.batches.is_empty()
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

    /// Batches complete in order, at most `keep` stay in flight, and each batch's changelog
    /// lands after the previous batch's, back to back.
    #[test]
    fn batches_complete_in_order_with_their_changelogs_back_to_back() {
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

        let mut flights = Flights::default();
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
            assert_eq!(flights.send(&producer, sealed).unwrap(), 20);
            completed.extend(flights.advance(&producer, 2).unwrap());
            assert!(flights.len() <= 2);
        }
        completed.extend(flights.advance(&producer, 0).unwrap());
        assert!(flights.is_empty());
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
}

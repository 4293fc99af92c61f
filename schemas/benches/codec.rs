//! Rough timings of the hot paths (no external harness): `cargo bench -p airlock-schemas`.
//!
//! Decoding a `ToolProposal` is on the processor's hot path; the target is well under 5 µs.

use std::{
    hint::black_box,
    time::{Duration, Instant},
};

use airlock_schemas::{Codec, Framing, Record, ToolProposal};

fn proposal() -> ToolProposal {
    ToolProposal {
        proposal_id: "01J9Z3W6Q8V4X2C7B5N1M0K3H8".into(),
        operation_key: "tenant-acme:run-7f3a:refund:order-42".into(),
        run_id: "run-7f3a9c2e".into(),
        logical_call_id: "call-0003".into(),
        provider_call_id: Some("toolu_01A09q90qw90lq917835lq9".into()),
        tenant_id: "acme".into(),
        principal_id: "user:alice@example.com".into(),
        tool: "payments.refund".into(),
        tool_version: "2.1.0".into(),
        arguments_json: r#"{"amount_cents":129900,"currency":"EUR","order_id":"order-42","reason":"customer request, damaged on arrival"}"#.into(),
        arguments_hash: Some("9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08".into()),
        lease_owner: "agent-worker-3".into(),
        lease_fence: 17,
        deadline_at: 1_700_000_060_000,
        proposed_at: 1_700_000_000_000,
    }
}

fn time(name: &str, iterations: u32, mut f: impl FnMut()) {
    for _ in 0..iterations / 10 {
        f();
    }
    let start = Instant::now();
    for _ in 0..iterations {
        f();
    }
    let per_op: Duration = start.elapsed() / iterations;
    println!("{name:<48} {:>8.0} ns/op", per_op.as_nanos());
}

fn main() {
    let codec = Codec::new();
    let value = proposal();
    let single = codec
        .encode(Framing::SingleObject, &value)
        .expect("proposal encodes");
    let raw = codec.encode_datum(&value).expect("proposal encodes");
    println!("ToolProposal: {} bytes single-object", single.len());
    let n = 200_000;

    time("decode_as::<ToolProposal> (single-object)", n, || {
        let decoded: ToolProposal = codec.decode_as(black_box(&single)).expect("decodes");
        black_box(decoded);
    });
    time("decode (auto-detect, AnyRecord)", n, || {
        black_box(codec.decode(black_box(&single)).expect("decodes"));
    });
    time("decode_datum::<ToolProposal>", n, || {
        let decoded: ToolProposal = codec.decode_datum(black_box(&raw)).expect("decodes");
        black_box(decoded);
    });
    time("apache-avro from_avro_datum + from_value", n, || {
        let value =
            apache_avro::from_avro_datum(ToolProposal::schema(), &mut black_box(&raw[..]), None)
                .expect("decodes");
        let decoded: ToolProposal = apache_avro::from_value(&value).expect("fits");
        black_box(decoded);
    });
    let mut buffer = Vec::with_capacity(1024);
    time("encode_into (single-object, reused buffer)", n, || {
        buffer.clear();
        codec
            .encode_into(Framing::SingleObject, black_box(&value), &mut buffer)
            .expect("encodes");
        black_box(&buffer);
    });
}

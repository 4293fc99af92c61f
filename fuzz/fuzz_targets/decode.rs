//! Every input and output schema's decoder over arbitrary bytes: an error or a record, never a
//! panic, and a record decoded from bytes encodes again within the codec's limit.
#![no_main]

use airlock_schemas::{
    Approval, Codec, Control, Decision, DispatchCommand, Outcome, ReconcileCommand, ToolProposal,
};
use libfuzzer_sys::fuzz_target;

/// The processor's default payload limit is larger; a small one reaches the size checks.
const MAX_PAYLOAD: usize = 16 * 1_024;

fuzz_target!(|data: &[u8]| {
    let codec = Codec::new().with_max_payload_bytes(MAX_PAYLOAD);
    // Whatever the framing says it is (single-object or Confluent, by fingerprint or id).
    if let Ok(decoded) = codec.decode(data) {
        let _ = format!("{:?}", decoded.record);
    }
    // Each kind as its topic's consumer reads it, whatever framing the bytes carry.
    macro_rules! each {
        ($($t:ty),*) => {$(
            if let Ok(record) = codec.decode_as::<$t>(data) {
                let again = codec
                    .encode_single_object(&record)
                    .expect("a decoded record encodes again");
                assert!(again.len() <= MAX_PAYLOAD + 16, "{} bytes", again.len());
            }
            let _ = codec.decode_datum::<$t>(data);
        )*};
    }
    each!(
        ToolProposal,
        Approval,
        Outcome,
        Control,
        Decision,
        DispatchCommand,
        ReconcileCommand
    );
});

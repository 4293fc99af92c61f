//! Canonical JSON over arbitrary text: an error, or a canonical form that is its own canonical
//! form, hashed as the arguments hash of that text.
#![no_main]

use airlock_processor::core::canonical::{arguments_hash, canonicalize};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(canonical) = canonicalize(text) else {
        return;
    };
    let again = canonicalize(&canonical.json).expect("a canonical form canonicalizes");
    assert_eq!(again.json, canonical.json, "canonicalizing is idempotent");
    assert_eq!(again.hash, canonical.hash);
    assert_eq!(arguments_hash(&canonical.json), canonical.hash);
});

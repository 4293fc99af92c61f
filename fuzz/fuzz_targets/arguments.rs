//! The reference tool registry's argument checks over arbitrary JSON, as the processor runs
//! them on a proposal's canonical arguments: the schema, the business invariants and the
//! tenant argument answer, never panic.
#![no_main]

use std::sync::LazyLock;

use airlock_processor::core::canonical::canonicalize;
use airlock_processor::core::registry::Registry;
use libfuzzer_sys::fuzz_target;

static REGISTRY: LazyLock<Registry> = LazyLock::new(|| {
    let dir = airlock_processor::sample::config_dir();
    Registry::load(&dir.join("tools.toml")).expect("the reference registry loads")
});

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(canonical) = canonicalize(text) else {
        return;
    };
    for tool in REGISTRY.tools() {
        if let Err(why) = tool.validate_arguments(&canonical.value) {
            assert!(why.len() <= 4_096, "a refusal of {} bytes", why.len());
            continue;
        }
        let _ = tool.check_invariants(&canonical.value);
        let _ = tool.tenant_of(&canonical.value);
    }
});

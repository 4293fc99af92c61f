//! The `airlock` binary.

use clap::Parser;

/// mimalloc instead of glibc's malloc: a decision allocates and frees many small values
/// (Cedar's evaluator, JSON, Avro, RocksDB batches) and glibc's allocator took about a fifth of
/// the decision path's CPU (`airlock-bench-core` under perf). The bench binaries use it too, so
/// that what they measure is what runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let cli = airlock_processor::cli::Cli::parse();
    match cli.run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("airlock: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

//! The `airlock` binary.

use clap::Parser;

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

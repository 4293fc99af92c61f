//! Graceful stop for every long-running Airlock process: the first SIGTERM or SIGINT sets a
//! flag the main loop checks between units of work; a second one exits at once (exit 130).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Sets `flag` on the first SIGTERM or SIGINT; a second one exits the process at once.
/// `finishing` names what the process completes before stopping ("the batch"), `abandoned`
/// what a second signal leaves to recovery; both go to the log.
pub fn watch(
    flag: Arc<AtomicBool>,
    finishing: &'static str,
    abandoned: &'static str,
) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("signals".to_owned())
        .spawn(move || {
            runtime.block_on(async move {
                use tokio::signal::unix::{SignalKind, signal};
                let (Ok(mut term), Ok(mut int)) = (
                    signal(SignalKind::terminate()),
                    signal(SignalKind::interrupt()),
                ) else {
                    log::error!("cannot install signal handlers; stop with SIGKILL");
                    return;
                };
                for round in 0.. {
                    let name = tokio::select! {
                        _ = term.recv() => "SIGTERM",
                        _ = int.recv() => "SIGINT",
                    };
                    if round > 0 {
                        log::warn!("second signal ({name}): exiting now ({abandoned})");
                        std::process::exit(130);
                    }
                    log::info!("{name}: finishing {finishing}, then stopping");
                    flag.store(true, Ordering::Relaxed);
                }
            });
        })?;
    Ok(())
}

//! One child process of the demo (the processor, the ledger, a connector worker): its output goes
//! to a log file, it can be frozen and resumed (SIGSTOP/SIGCONT, a worker that stalls mid-call),
//! and it is always stopped when the demo ends, on success, error or Ctrl-C: SIGTERM first, then
//! SIGKILL when it does not exit within a bound.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

/// How long a child gets to exit after SIGTERM before it is killed.
pub const STOP_GRACE: Duration = Duration::from_secs(20);

#[derive(Debug)]
pub struct Proc {
    /// What it is, in messages ("the ledger", "worker demo-worker-1").
    pub name: String,
    /// Where its stdout and stderr go.
    pub log: PathBuf,
    child: Child,
    /// Set once it has been waited for: its pid may belong to another process by then.
    exited: Option<ExitStatus>,
}

impl Proc {
    /// Starts `command` with stdin closed and stdout+stderr appended to `log`.
    pub fn spawn(name: &str, mut command: Command, log: &Path) -> anyhow::Result<Proc> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::from(file.try_clone()?))
            .stderr(Stdio::from(file))
            .spawn()
            .with_context(|| format!("starting {name} ({:?})", command.get_program()))?;
        Ok(Proc::adopt(name, child, log))
    }

    /// Takes charge of a child started elsewhere (its output already routed).
    pub fn adopt(name: &str, child: Child, log: &Path) -> Proc {
        Proc {
            name: name.to_owned(),
            log: log.to_owned(),
            child,
            exited: None,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its exit status, if it has exited (without waiting).
    pub fn exited(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        if self.exited.is_none() {
            self.exited = self
                .child
                .try_wait()
                .with_context(|| format!("checking on {}", self.name))?;
        }
        Ok(self.exited)
    }

    /// Sends `signal` (`STOP`, `CONT`, `TERM`) with kill(1); the workspace forbids `unsafe`.
    pub fn signal(&mut self, signal: &str) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.exited()?.is_none(),
            "{} has already exited ({})",
            self.name,
            self.exited.map_or(String::new(), |s| s.to_string())
        );
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .context("running kill(1)")?;
        anyhow::ensure!(status.success(), "kill -{signal} {} failed", self.pid());
        Ok(())
    }

    /// SIGCONT (it may be frozen) and SIGTERM, then waits up to `grace`, then SIGKILL. Returns
    /// its exit status and whether it stopped by itself.
    pub fn stop(&mut self, grace: Duration) -> anyhow::Result<(ExitStatus, bool)> {
        if let Some(status) = self.exited()? {
            return Ok((status, true));
        }
        // Best effort: it may exit between the check and the signal.
        let _ = self.signal("CONT");
        let _ = self.signal("TERM");
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Some(status) = self.exited()? {
                return Ok((status, true));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        log::warn!(
            "{} did not stop within {grace:?} of SIGTERM: killing it",
            self.name
        );
        self.child
            .kill()
            .with_context(|| format!("killing {}", self.name))?;
        let status = self.child.wait()?;
        self.exited = Some(status);
        Ok((status, false))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Err(e) = self.stop(STOP_GRACE) {
            eprintln!("demo: stopping {}: {e:#}", self.name);
        }
    }
}

/// The last `n` lines of a text file (empty when unreadable).
pub fn tail(path: &Path, n: usize) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| (*l).to_owned())
        .collect()
}

/// How many lines of the text file contain `needle`.
pub fn count_lines(path: &Path, needle: &str) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(needle))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_that_ignores_nothing_stops_on_sigterm() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let log = dir.path().join("sleep.log");
        let mut command = Command::new("sh");
        command.args(["-c", "echo started; exec sleep 30"]);
        let mut p = Proc::spawn("a sleeper", command, &log)?;
        p.signal("STOP")?;
        p.signal("CONT")?;
        let (status, by_itself) = p.stop(Duration::from_secs(10))?;
        assert!(by_itself, "SIGTERM was enough");
        assert!(!status.success(), "terminated by a signal: {status}");
        assert!(p.signal("TERM").is_err(), "no signal to an exited child");
        Ok(())
    }

    #[test]
    fn log_lines_are_counted_and_tailed() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let log = dir.path().join("x.log");
        std::fs::write(&log, "a 1\nb 2\na 3\n")?;
        assert_eq!(count_lines(&log, "a "), 2);
        assert_eq!(tail(&log, 2), ["b 2", "a 3"]);
        assert!(tail(&dir.path().join("missing"), 3).is_empty());
        Ok(())
    }
}

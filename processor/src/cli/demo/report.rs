//! What each scenario should end with, what it did end with, and the plain report printed at
//! the end: per operation key the attempts (dispatch commands issued), the decisions in order,
//! the business effects the ledger holds, and the final state; per scenario ok or FAIL with
//! every difference spelled out.

use std::io::Write;

use airlock_schemas::{Decision, EffectState, Reason, Verdict};

use super::ledger::Ledger;
use super::watch::{History, Watch};

/// What one operation key should end with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expect {
    pub key: String,
    /// Dispatch commands (attempt epochs) issued for it.
    pub attempts: usize,
    /// Business effects on the ledger under it.
    pub effects: u64,
    /// Its final state; `None` when nothing may be recorded (denied by policy, refused).
    pub state: Option<EffectState>,
}

/// What one operation key did end with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    pub attempts: usize,
    pub reconcile_rounds: usize,
    /// `VERDICT REASON (input)`, in the order of the key's partition.
    pub decisions: Vec<String>,
    pub effects: u64,
    pub state: Option<EffectState>,
    pub dead_letters: Vec<String>,
}

#[derive(Debug)]
pub struct Report {
    pub title: &'static str,
    pub expect: Vec<Expect>,
    pub notes: Vec<String>,
    pub problems: Vec<String>,
}

impl Report {
    pub fn new(title: &'static str) -> Report {
        Report {
            title,
            expect: Vec::new(),
            notes: Vec::new(),
            problems: Vec::new(),
        }
    }

    pub fn expect(&mut self, key: &str, attempts: usize, effects: u64, state: Option<EffectState>) {
        self.expect.push(Expect {
            key: key.to_owned(),
            attempts,
            effects,
            state,
        });
    }

    pub fn note(&mut self, text: impl Into<String>) {
        self.notes.push(text.into());
    }

    pub fn problem(&mut self, text: impl Into<String>) {
        self.problems.push(text.into());
    }

    /// Records a problem unless `got` answers `want`; true when it does.
    pub fn check(&mut self, what: &str, got: &Decision, want: (Verdict, Reason)) -> bool {
        let ok = (got.verdict, got.reason) == want;
        if !ok {
            self.problem(format!(
                "{what}: expected {} {}, got {} {} ({})",
                want.0.as_str(),
                want.1.as_str(),
                got.verdict.as_str(),
                got.reason.as_str(),
                got.detail
            ));
        }
        ok
    }
}

/// The observation of `key` from what was read, and the ledger's count.
pub fn observe(watch: &Watch, ledger: &Ledger, key: &str) -> anyhow::Result<Observed> {
    let h: History = watch.history(key);
    let decisions = h
        .decisions
        .iter()
        .map(|d| {
            let input = watch
                .input_name(&d.in_reply_to)
                .map_or(String::new(), |w| format!(" ({w})"));
            format!("{} {}{input}", d.verdict.as_str(), d.reason.as_str())
        })
        .collect();
    let state = h
        .decisions
        .iter()
        .rev()
        .find_map(|d| d.state)
        .or_else(|| h.journal.iter().rev().find_map(|e| e.state));
    Ok(Observed {
        attempts: h.dispatched.len(),
        reconcile_rounds: h.reconcile_rounds.len(),
        decisions,
        effects: ledger.effects_for(key)?,
        state,
        dead_letters: h.dead_letters,
    })
}

/// The differences between what `e` wanted and what `o` shows.
pub fn differences(e: &Expect, o: &Observed) -> Vec<String> {
    let mut out = Vec::new();
    if o.attempts != e.attempts {
        out.push(format!(
            "{}: {} attempts, expected {}",
            e.key, o.attempts, e.attempts
        ));
    }
    if o.effects != e.effects {
        out.push(format!(
            "{}: {} business effects on the ledger, expected {}",
            e.key, o.effects, e.effects
        ));
    }
    if o.state != e.state {
        out.push(format!(
            "{}: final state {}, expected {}",
            e.key,
            state_name(o.state),
            state_name(e.state)
        ));
    }
    out
}

fn state_name(state: Option<EffectState>) -> &'static str {
    state.map_or("none (nothing recorded)", |s| s.as_str())
}

/// Prints scenario `n`'s report, with the final observation of each of its keys; returns
/// whether it passed.
pub fn render(
    n: usize,
    report: &mut Report,
    watch: &Watch,
    ledger: &Ledger,
    out: &mut dyn Write,
) -> anyhow::Result<bool> {
    let mut rows = Vec::new();
    for e in &report.expect {
        let o = observe(watch, ledger, &e.key)?;
        report.problems.extend(differences(e, &o));
        rows.push((e.clone(), o));
    }
    let ok = report.problems.is_empty();
    writeln!(
        out,
        "\n  {:<4} {n}. {}",
        if ok { "ok" } else { "FAIL" },
        report.title
    )?;
    for (e, o) in &rows {
        let reconciled = if o.reconcile_rounds > 0 {
            format!(", reconciliation rounds {}", o.reconcile_rounds)
        } else {
            String::new()
        };
        writeln!(
            out,
            "         {}\n           attempts {}{reconciled}, ledger effects {} (expected {}), final \
             state {}",
            e.key,
            o.attempts,
            o.effects,
            e.effects,
            state_name(o.state)
        )?;
        let decisions = if o.decisions.is_empty() {
            "none".to_owned()
        } else {
            o.decisions.join(" -> ")
        };
        writeln!(out, "           decisions: {decisions}")?;
        if !o.dead_letters.is_empty() {
            writeln!(
                out,
                "           dead letters: {}",
                o.dead_letters.join(", ")
            )?;
        }
    }
    for note in &report.notes {
        writeln!(out, "         - {note}")?;
    }
    for problem in &report.problems {
        writeln!(out, "         PROBLEM: {problem}")?;
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expect() -> Expect {
        Expect {
            key: "refund:k".to_owned(),
            attempts: 1,
            effects: 1,
            state: Some(EffectState::Committed),
        }
    }

    fn observed(attempts: usize, effects: u64, state: Option<EffectState>) -> Observed {
        Observed {
            attempts,
            reconcile_rounds: 0,
            decisions: Vec::new(),
            effects,
            state,
            dead_letters: Vec::new(),
        }
    }

    #[test]
    fn a_key_that_ended_as_expected_has_no_differences() {
        assert!(differences(&expect(), &observed(1, 1, Some(EffectState::Committed))).is_empty());
    }

    #[test]
    fn a_second_effect_or_attempt_or_another_state_is_a_difference() {
        let d = differences(&expect(), &observed(2, 2, Some(EffectState::Unknown)));
        assert_eq!(d.len(), 3, "{d:?}");
        assert!(d[1].contains("2 business effects"), "{d:?}");
        let none = Expect {
            state: None,
            ..expect()
        };
        let d = differences(&none, &observed(1, 1, Some(EffectState::Denied)));
        assert_eq!(
            d,
            ["refund:k: final state DENIED, expected none (nothing recorded)"]
        );
    }
}

//! What-if: the recorded proposals screened under the policy bundle in force and under a
//! candidate (DESIGN.md section 8). Only the stateless steps are compared (validation and
//! policy, section 4 steps 1 to 6): whether a proposal would be accepted, sent for approval or
//! refused, not what its key's history would have made of it.

use std::collections::{BTreeMap, HashSet};

use airlock_schemas::{Reason, ToolProposal, Verdict};

use crate::core::Core;

/// Examples kept per change.
pub const EXAMPLES: usize = 5;

/// A screening result: the verdict and reason steps 1 to 6 give.
pub type Screening = (Verdict, Reason);

/// One proposal whose screening changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Example {
    pub proposal_id: String,
    pub operation_key: String,
    pub principal_id: String,
    pub tool: String,
}

/// The comparison so far.
#[derive(Debug, Default)]
pub struct WhatIf {
    /// Proposal ids already screened (a producer resend is one proposal).
    seen: HashSet<String>,
    pub evaluated: u64,
    pub unchanged: u64,
    /// (in force, candidate) -> how many, and the first few.
    pub changes: BTreeMap<(Screening, Screening), (u64, Vec<Example>)>,
}

impl WhatIf {
    /// Screens `p` under both cores; a proposal id seen before is skipped.
    pub fn observe(&mut self, in_force: &Core, candidate: &Core, p: &ToolProposal) {
        if !self.seen.insert(p.proposal_id.clone()) {
            return;
        }
        self.evaluated += 1;
        let before = in_force.screen_proposal(p);
        let after = candidate.screen_proposal(p);
        if before == after {
            self.unchanged += 1;
            return;
        }
        let (count, examples) = self.changes.entry((before, after)).or_default();
        *count += 1;
        if examples.len() < EXAMPLES {
            examples.push(Example {
                proposal_id: p.proposal_id.clone(),
                operation_key: p.operation_key.clone(),
                principal_id: p.principal_id.clone(),
                tool: p.tool.clone(),
            });
        }
    }

    /// How many proposals would be decided differently.
    pub fn changed(&self) -> u64 {
        self.changes.values().map(|(n, _)| n).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::policy::Policy;
    use crate::core::registry::Registry;
    use crate::sample;

    #[test]
    fn a_stricter_bundle_names_the_refunds_it_would_deny() -> anyhow::Result<()> {
        let in_force = sample::reference_core(crate::core::Config::default())?;
        let dir = sample::config_dir();
        let policies = std::fs::read_to_string(dir.join("policies.cedar"))?;
        let entities = std::fs::read_to_string(dir.join("entities.json"))?;
        let stricter = format!(
            "{policies}\n@id(\"no-refunds-over-5-eur\")\nforbid (principal, action == Airlock::Action::\"invoke\", resource == Airlock::Tool::\"refund\")\nwhen {{ context.arguments.amount.minor_units > 500 }};\n"
        );
        let candidate = Core::new(
            Registry::load(&dir.join("tools.toml"))?,
            Policy::from_sources(&stricter, &entities)?,
            in_force.config().clone(),
        );
        let mut w = WhatIf::default();
        for (key, amount) in [("a", 300), ("b", 900), ("c", 2_000)] {
            let p = sample::refund(key, amount, 1_000);
            w.observe(&in_force, &candidate, &p);
            w.observe(&in_force, &candidate, &p);
        }
        assert_eq!(w.evaluated, 3);
        assert_eq!(w.unchanged, 1);
        assert_eq!(w.changed(), 2);
        let to_denied: Vec<_> = w
            .changes
            .iter()
            .filter(|((_, after), _)| *after == (Verdict::Denied, Reason::PolicyDenied))
            .flat_map(|(_, (_, ex))| ex.iter().map(|e| e.operation_key.clone()))
            .collect();
        assert_eq!(to_denied, ["b", "c"]);
        Ok(())
    }
}

//! Authorization of tool-call proposals and approvals with Cedar.
//!
//! A policy bundle is a Cedar policy file plus a Cedar entities JSON file.
//!
//! Entity model:
//! * principals (agents and humans): `Airlock::Principal::"<id>"`, with
//!   attributes (e.g. `tenant`) and parents (e.g. `Airlock::Role::"finance-approver"`)
//!   supplied by the entities file;
//! * resources: `Airlock::Tool::"<tool name>"`;
//! * actions: `Airlock::Action::"invoke"` (an agent proposes a call) and
//!   `Airlock::Action::"approve"` (a human approves a pending call).
//!
//! The request context is
//! `{ "tenant", "tool_version", "resource", "run_id", "arguments" }`, where
//! `arguments` are the canonical arguments. Cedar has neither null nor
//! floats: object fields whose value is null are dropped (recursively), and a
//! null inside an array or a non-integer number makes the request invalid,
//! which denies it. The context is built from the restricted-expression API, never Cedar's
//! JSON parser, which reads objects keyed `__entity` or `__extn` as entity references or
//! extension values and would let an agent smuggle an entity reference into the arguments.
//! Only the arguments the tool's policies can read are converted (see the private `context`
//! module).
//!
//! Tiers: every `permit` that can apply to `invoke` must carry
//! `@tier("auto")` (executes without a human) or `@tier("approval")` (needs
//! approval); a `forbid` must not carry a tier. The tier is meaningless for
//! `approve`, so a permit whose action scope admits only `approve` may omit
//! it. `@id("...")` names a policy; those names appear in decisions.
//!
//! Index: only policies that can apply to the proposal's tool are evaluated.
//! A policy scoped `resource == Airlock::Tool::"x"` is evaluated only for
//! tool `x`; every other policy is evaluated for every tool. The per-tool
//! policy sets are built once at load, per action, and inside them the scope
//! constraints the set already decided (the action scope; a tool's own
//! `resource == Airlock::Tool::"x"`) are dropped, so Cedar does not compare
//! entities whose comparison is known to hold.
//!
//! Evaluation fails closed: if any policy errors while evaluating a request
//! that would otherwise be allowed, the request is denied as invalid,
//! because the erroring policy might have been a forbid.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use cedar_policy::{
    ActionConstraint, Authorizer, Decision, Effect, Entities, EntityId, EntityTypeName, EntityUid,
    PolicyId, PolicySet, Request, ResourceConstraint,
};
use serde_json::Value;
use sha2::{Digest, Sha256};

mod context;

use context::Reads;

/// Entity type of agents and humans.
pub const PRINCIPAL_TYPE: &str = "Airlock::Principal";
/// Entity type of tools.
pub const TOOL_TYPE: &str = "Airlock::Tool";
/// Attribute of a principal entity: the hex Ed25519 verifying keys its approvals and operator
/// controls must be signed with (`airlock keygen` prints one), a set of strings.
pub const VERIFYING_KEYS_ATTR: &str = "verifying_keys";
/// Entity type of actions.
pub const ACTION_TYPE: &str = "Airlock::Action";
/// Action id for proposing a call.
pub const INVOKE_ACTION: &str = "invoke";
/// Action id for approving a call.
pub const APPROVE_ACTION: &str = "approve";
/// Action id for settling an intent by hand (`airlock settle`: COMMITTED or FAILED).
pub const SETTLE_ACTION: &str = "settle";
/// Action id for cancelling an intent.
pub const CANCEL_ACTION: &str = "cancel";

/// What an operator's control does to an intent, as the policies name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// [`SETTLE_ACTION`].
    Settle,
    /// [`CANCEL_ACTION`].
    Cancel,
}

impl Operation {
    /// The Cedar action id.
    pub fn action(self) -> &'static str {
        match self {
            Operation::Settle => SETTLE_ACTION,
            Operation::Cancel => CANCEL_ACTION,
        }
    }
}

/// Domain tag of [`Policy::bundle_hash`], versioning the hashing scheme (v1 hashed the raw
/// texts, so a comment changed it).
const BUNDLE_HASH_DOMAIN: &[u8] = b"airlock/policy-bundle/v2\0";

/// Errors raised while loading a policy bundle.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A bundle file could not be read.
    #[error("cannot read policy bundle file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The policy text does not parse.
    #[error("cannot parse Cedar policies {origin}: {message}")]
    Parse {
        /// The policy file path, or `<inline>`.
        origin: String,
        /// Cedar's messages.
        message: String,
    },
    /// The entities JSON is invalid.
    #[error("invalid Cedar entities {origin}: {message}")]
    Entities {
        /// The entities file path, or `<inline>`.
        origin: String,
        /// Cedar's message.
        message: String,
    },
    /// Templates (policies with `?principal`/`?resource` slots) are not supported.
    #[error("policy {policy} is a template; only static policies are supported")]
    Template {
        /// The template's `@id`, or Cedar's positional id.
        policy: String,
    },
    /// A permit that can apply to `invoke` has no `@tier`.
    #[error(
        "permit policy {policy} applies to action invoke but has no @tier(\"auto\") or \
         @tier(\"approval\")"
    )]
    MissingTier {
        /// The policy.
        policy: String,
    },
    /// A permit carries a tier other than `auto` or `approval`.
    #[error("policy {policy} has unknown @tier({tier:?}); expected \"auto\" or \"approval\"")]
    UnknownTier {
        /// The policy.
        policy: String,
        /// The tier found.
        tier: String,
    },
    /// A forbid carries a tier (tiers only qualify permits).
    #[error("forbid policy {policy} must not carry @tier({tier:?})")]
    TierOnForbid {
        /// The policy.
        policy: String,
        /// The tier found.
        tier: String,
    },
    /// An `@id` is empty.
    #[error("policy {policy} has an empty @id")]
    EmptyId {
        /// Cedar's positional id of the policy.
        policy: String,
    },
    /// Two policies share an id.
    #[error("policy id {policy} is used more than once")]
    DuplicateId {
        /// The duplicated id.
        policy: String,
    },
}

/// Result alias for this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Whether an allowed proposal may execute directly or needs human approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tier {
    Auto,
    Approval,
}

/// The inputs of one authorization.
#[derive(Debug, Clone, Copy)]
pub struct AuthzRequest<'a> {
    /// The agent (for invoke) or approver (for approve).
    pub principal: &'a str,
    /// Tenant of the proposal.
    pub tenant: &'a str,
    /// Tool name.
    pub tool: &'a str,
    /// Tool version.
    pub tool_version: &'a str,
    /// Resource acted on, as extracted by the registry.
    pub resource: &'a str,
    /// The agent run that proposed the call.
    pub run_id: &'a str,
    /// Canonical arguments.
    pub arguments: &'a Value,
}

/// Outcome of [`Policy::authorize_invoke`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authz {
    /// Allowed; no determining permit requires approval.
    Auto {
        /// Ids of the determining permits, sorted.
        policies: Vec<String>,
    },
    /// Allowed subject to human approval.
    Approval {
        /// Ids of the determining permits, sorted.
        policies: Vec<String>,
    },
    /// Denied.
    Deny {
        /// Why.
        reason: DenyReason,
    },
}

impl Authz {
    /// One-line human-readable description, for record detail text.
    pub fn summary(&self) -> String {
        match self {
            Authz::Auto { policies } => {
                format!("allowed automatically by {}", policies.join(", "))
            }
            Authz::Approval { policies } => {
                format!("allowed subject to approval by {}", policies.join(", "))
            }
            Authz::Deny { reason } => format!("denied: {reason}"),
        }
    }
}

/// Why a request was denied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DenyReason {
    /// One or more forbid policies matched.
    Forbidden {
        /// Ids of the determining forbids, sorted.
        policies: Vec<String>,
    },
    /// No permit matched.
    NoPermit,
    /// The principal is not in the entities: refused before any policy is evaluated, so a
    /// policy written for known principals (`principal has tenant && ...`) cannot be slipped
    /// past by an identity nobody registered.
    UnknownPrincipal(String),
    /// The request could not be built, or a policy errored during evaluation
    /// (fail closed).
    Invalid(String),
}

impl fmt::Display for DenyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DenyReason::Forbidden { policies } => {
                write!(f, "forbidden by {}", policies.join(", "))
            }
            DenyReason::NoPermit => f.write_str("no policy permits it"),
            DenyReason::UnknownPrincipal(id) => {
                write!(f, "principal {id:?} is not in the policy entities")
            }
            DenyReason::Invalid(message) => {
                write!(f, "request could not be evaluated: {message}")
            }
        }
    }
}

/// A loaded policy bundle: Cedar policies indexed per tool, entities, and
/// the bundle hash.
pub struct Policy {
    /// Policies whose action scope admits `invoke`, indexed per tool.
    invoke_index: ToolIndex,
    /// Policies whose action scope admits `approve`, indexed per tool.
    approve_index: ToolIndex,
    /// Tier of each permit that has one, by policy id.
    tiers: HashMap<PolicyId, Tier>,
    entities: Entities,
    authorizer: Authorizer,
    principal_type: EntityTypeName,
    tool_type: EntityTypeName,
    invoke: EntityUid,
    approve: EntityUid,
    settle: EntityUid,
    cancel: EntityUid,
    /// Policies whose action scope admits `settle`, and `cancel`, indexed per tool.
    settle_index: ToolIndex,
    cancel_index: ToolIndex,
    /// Per principal id, the verifying keys of [`VERIFYING_KEYS_ATTR`] (principals without
    /// any are absent).
    person_keys: BTreeMap<String, Vec<ed25519_dalek::VerifyingKey>>,
    /// Each principal's tenant, by principal id ([`Policy::principal_tenant`]).
    principal_tenants: BTreeMap<String, String>,
    bundle_hash: String,
}

impl Policy {
    /// Builds a bundle from Cedar policy text and Cedar entities JSON.
    ///
    /// # Errors
    ///
    /// Parse errors, invalid entities, templates, missing/unknown/misplaced
    /// tiers, and empty or duplicate policy ids.
    pub fn from_sources(policies_cedar: &str, entities_json: &str) -> Result<Policy> {
        Self::build(policies_cedar, entities_json, "<inline>", "<inline>")
    }

    /// Reads and builds a bundle from a `.cedar` file and an entities JSON file.
    ///
    /// # Errors
    ///
    /// [`Error::Read`] if a file cannot be read, otherwise as
    /// [`Policy::from_sources`].
    pub fn load(policies_path: &Path, entities_path: &Path) -> Result<Policy> {
        let read = |path: &Path| {
            std::fs::read_to_string(path).map_err(|source| Error::Read {
                path: path.to_path_buf(),
                source,
            })
        };
        let policies = read(policies_path)?;
        let entities = read(entities_path)?;
        Self::build(
            &policies,
            &entities,
            &policies_path.display().to_string(),
            &entities_path.display().to_string(),
        )
    }

    /// Lowercase hex SHA-256 of what the bundle means, not how it is written: over a domain
    /// tag, every policy as its id and its canonical JSON form (Cedar's JSON policy format,
    /// annotations included; sorted by id) and every entity as canonical JSON (sorted), each
    /// part length-prefixed (u64 big-endian) and each list count-prefixed. Comments, layout,
    /// the order of policies with an `@id` and of entities, and the key order of the entities
    /// file change nothing; any change to a policy or an entity changes it. Recorded with every
    /// decision.
    pub fn bundle_hash(&self) -> &str {
        &self.bundle_hash
    }

    /// The verifying keys registered for principal `id` ([`VERIFYING_KEYS_ATTR`]), if any: its
    /// approvals and operator controls count only signed by one of them.
    pub fn person_keys(&self, id: &str) -> Option<&[ed25519_dalek::VerifyingKey]> {
        self.person_keys.get(id).map(Vec::as_slice)
    }

    /// The tenants the principals of the entities belong to (their `tenant` attribute).
    pub fn principal_tenants(&self) -> std::collections::BTreeSet<String> {
        self.principal_tenants.values().cloned().collect()
    }

    /// The tenant principal `id` belongs to, when the entities give it one.
    pub fn principal_tenant(&self, id: &str) -> Option<&str> {
        self.principal_tenants.get(id).map(String::as_str)
    }

    /// How many principals have verifying keys registered.
    pub fn people_with_keys(&self) -> usize {
        self.person_keys.len()
    }

    /// Ids of the policies evaluated when an agent invokes `tool`, sorted.
    /// Introspection for operators ("which rules can affect this tool?") and
    /// tests.
    pub fn applicable_policy_ids(&self, tool: &str) -> Vec<String> {
        let mut ids: Vec<String> = self
            .invoke_index
            .entry(tool)
            .0
            .policies()
            .map(|policy| policy.id().to_string())
            .collect();
        ids.sort();
        ids
    }

    /// Decides whether `req.principal` may invoke `req.tool`, and at which tier.
    pub fn authorize_invoke(&self, req: &AuthzRequest<'_>) -> Authz {
        let response = match self.evaluate(req, &self.invoke, &self.invoke_index) {
            Ok(response) => response,
            Err(reason) => return Authz::Deny { reason },
        };
        let determining = sorted_ids(response.diagnostics().reason());
        let errors = sorted_errors(&response);
        if response.decision() == Decision::Deny {
            return Authz::Deny {
                reason: deny_reason(determining, errors),
            };
        }
        if let Some(errors) = errors {
            // Allowed, but a policy errored: it might have been a forbid.
            return Authz::Deny {
                reason: DenyReason::Invalid(errors),
            };
        }
        let mut needs_approval = false;
        for id in response.diagnostics().reason() {
            match self.tiers.get(id) {
                Some(Tier::Approval) => needs_approval = true,
                Some(Tier::Auto) => {}
                None => {
                    // Load-time validation makes this impossible (a permit
                    // without tier cannot apply to invoke); fail closed if
                    // that reasoning is ever wrong.
                    return Authz::Deny {
                        reason: DenyReason::Invalid(format!(
                            "permit {id} allowed invoke but has no tier"
                        )),
                    };
                }
            }
        }
        if needs_approval {
            Authz::Approval {
                policies: determining,
            }
        } else {
            Authz::Auto {
                policies: determining,
            }
        }
    }

    /// Decides whether `req.principal` (the approver) is entitled to approve
    /// the proposal described by `req`.
    ///
    /// # Errors
    ///
    /// The [`DenyReason`] when Cedar does not allow action `approve`, or when
    /// evaluation errored.
    pub fn authorize_approve(&self, req: &AuthzRequest<'_>) -> std::result::Result<(), DenyReason> {
        self.permitted(req, &self.approve, &self.approve_index)
    }

    /// Decides whether `req.principal` (an operator) may settle or cancel the intent described
    /// by `req`: Cedar action `settle` or `cancel` on its tool, in its tenant.
    ///
    /// # Errors
    ///
    /// The [`DenyReason`] when Cedar does not allow the action, or when evaluation errored.
    pub fn authorize_operation(
        &self,
        operation: Operation,
        req: &AuthzRequest<'_>,
    ) -> std::result::Result<(), DenyReason> {
        match operation {
            Operation::Settle => self.permitted(req, &self.settle, &self.settle_index),
            Operation::Cancel => self.permitted(req, &self.cancel, &self.cancel_index),
        }
    }

    /// Allowed by Cedar for `action`, with no evaluation error: an action without tiers.
    fn permitted(
        &self,
        req: &AuthzRequest<'_>,
        action: &EntityUid,
        index: &ToolIndex,
    ) -> std::result::Result<(), DenyReason> {
        let response = self.evaluate(req, action, index)?;
        let errors = sorted_errors(&response);
        if response.decision() == Decision::Deny {
            let determining = sorted_ids(response.diagnostics().reason());
            return Err(deny_reason(determining, errors));
        }
        match errors {
            Some(errors) => Err(DenyReason::Invalid(errors)),
            None => Ok(()),
        }
    }

    fn evaluate(
        &self,
        req: &AuthzRequest<'_>,
        action: &EntityUid,
        index: &ToolIndex,
    ) -> std::result::Result<cedar_policy::Response, DenyReason> {
        let (set, reads) = index.entry(req.tool);
        let context = context::build(req, reads).map_err(DenyReason::Invalid)?;
        let principal = EntityUid::from_type_name_and_id(
            self.principal_type.clone(),
            EntityId::new(req.principal),
        );
        if self.entities.get(&principal).is_none() {
            return Err(DenyReason::UnknownPrincipal(req.principal.to_owned()));
        }
        let resource =
            EntityUid::from_type_name_and_id(self.tool_type.clone(), EntityId::new(req.tool));
        let request = Request::new(principal, action.clone(), resource, context, None)
            .map_err(|error| DenyReason::Invalid(format!("request: {error}")))?;
        Ok(self.authorizer.is_authorized(&request, set, &self.entities))
    }

    fn build(
        policies_cedar: &str,
        entities_json: &str,
        policies_origin: &str,
        entities_origin: &str,
    ) -> Result<Policy> {
        let parsed = PolicySet::from_str(policies_cedar).map_err(|errors| {
            let mut message = errors
                .iter()
                .map(|error| error_chain(error))
                .collect::<Vec<_>>()
                .join("; ");
            if let Some(line) = locate_parse_error(policies_cedar) {
                message = format!("in the policy starting at line {line}: {message}");
            }
            Error::Parse {
                origin: policies_origin.to_owned(),
                message,
            }
        })?;
        if let Some(template) = parsed.templates().next() {
            return Err(Error::Template {
                policy: template
                    .annotation("id")
                    .map_or_else(|| template.id().to_string(), str::to_owned),
            });
        }
        let entities =
            Entities::from_json_str(entities_json, None).map_err(|error| Error::Entities {
                origin: entities_origin.to_owned(),
                message: error_chain(&error),
            })?;

        let principal_type = entity_type(PRINCIPAL_TYPE);
        let tool_type = entity_type(TOOL_TYPE);
        let action_type = entity_type(ACTION_TYPE);
        let invoke =
            EntityUid::from_type_name_and_id(action_type.clone(), EntityId::new(INVOKE_ACTION));
        let approve =
            EntityUid::from_type_name_and_id(action_type.clone(), EntityId::new(APPROVE_ACTION));
        let settle =
            EntityUid::from_type_name_and_id(action_type.clone(), EntityId::new(SETTLE_ACTION));
        let cancel = EntityUid::from_type_name_and_id(action_type, EntityId::new(CANCEL_ACTION));

        let mut tiers = HashMap::new();
        let mut seen_ids = HashSet::new();
        let mut general = Vec::new();
        let mut specific: HashMap<String, Vec<cedar_policy::Policy>> = HashMap::new();
        // (id, canonical JSON) of every policy, for the bundle hash.
        let mut canonical_policies = Vec::new();
        // `policies()` iterates in text order, so the first error reported
        // is the first offending policy in the file.
        for policy in parsed.policies() {
            let id = match policy.annotation("id") {
                Some("") => {
                    return Err(Error::EmptyId {
                        policy: policy.id().to_string(),
                    });
                }
                Some(id) => PolicyId::new(id),
                None => policy.id().clone(),
            };
            if !seen_ids.insert(id.clone()) {
                return Err(Error::DuplicateId {
                    policy: id.to_string(),
                });
            }
            let name = id.to_string();
            let json = policy
                .to_json()
                .map(|v| sorted_json(&v))
                .map_err(|e| e.to_string())
                .map_err(|message| Error::Parse {
                    origin: policies_origin.to_owned(),
                    message: format!("policy {name} has no JSON form: {message}"),
                })?;
            canonical_policies.push((name.clone(), json));
            match (policy.effect(), policy.annotation("tier")) {
                (Effect::Forbid, None) => {}
                (Effect::Forbid, Some(tier)) => {
                    return Err(Error::TierOnForbid {
                        policy: name,
                        tier: tier.to_owned(),
                    });
                }
                (Effect::Permit, Some("auto")) => {
                    tiers.insert(id.clone(), Tier::Auto);
                }
                (Effect::Permit, Some("approval")) => {
                    tiers.insert(id.clone(), Tier::Approval);
                }
                (Effect::Permit, Some(tier)) => {
                    return Err(Error::UnknownTier {
                        policy: name,
                        tier: tier.to_owned(),
                    });
                }
                (Effect::Permit, None) => {
                    if admits(&policy.action_constraint(), &invoke, &entities) {
                        return Err(Error::MissingTier { policy: name });
                    }
                }
            }
            let renamed = policy.new_id(id);
            match policy.resource_constraint() {
                ResourceConstraint::Eq(uid) if uid.type_name() == &tool_type => {
                    specific
                        .entry(uid.id().unescaped().to_owned())
                        .or_default()
                        .push(renamed);
                }
                // `in`, `is`, unconstrained, or `==` another type: keep it
                // everywhere. (`==` another type can never match a tool, but
                // keeping it is the conservative choice.)
                _ => general.push(renamed),
            }
        }

        // Only the policies that can apply to the request's action and tool are evaluated:
        // Cedar's cost grows with every policy it has to look at. Inside a set, the scope
        // constraints the set's key already decided are dropped (see [`settled`]).
        let index_for = |action: &EntityUid| -> Result<ToolIndex> {
            let relevant =
                |p: &&cedar_policy::Policy| admits(&p.action_constraint(), action, &entities);
            let general = general
                .iter()
                .filter(relevant)
                .map(|p| settled(p, Settled::Action))
                .collect::<Result<Vec<_>>>()?;
            let mut per_tool = HashMap::with_capacity(specific.len());
            for (tool, own) in &specific {
                let own = own
                    .iter()
                    .filter(relevant)
                    .map(|p| settled(p, Settled::ActionAndResource))
                    .collect::<Result<Vec<_>>>()?;
                per_tool.insert(
                    tool.clone(),
                    policy_set(own.into_iter().chain(general.iter().cloned())),
                );
            }
            Ok(ToolIndex::new(
                per_tool,
                policy_set(general.iter().cloned()),
            ))
        };
        let invoke_index = index_for(&invoke)?;
        let approve_index = index_for(&approve)?;
        let settle_index = index_for(&settle)?;
        let cancel_index = index_for(&cancel)?;
        let canonical_entities =
            canonical_entities(entities_json).map_err(|message| Error::Entities {
                origin: entities_origin.to_owned(),
                message,
            })?;
        let person_keys = person_keys(entities_json).map_err(|message| Error::Entities {
            origin: entities_origin.to_owned(),
            message,
        })?;
        let principal_tenants = principals(entities_json)
            .map_err(|message| Error::Entities {
                origin: entities_origin.to_owned(),
                message,
            })?
            .into_iter()
            .filter_map(|(id, entity)| {
                let tenant = entity.get("attrs")?.get("tenant")?.as_str()?;
                Some((id, tenant.to_owned()))
            })
            .collect();

        Ok(Policy {
            invoke_index,
            approve_index,
            settle_index,
            cancel_index,
            tiers,
            entities,
            authorizer: Authorizer::new(),
            principal_type,
            tool_type,
            invoke,
            approve,
            settle,
            cancel,
            person_keys,
            principal_tenants,
            bundle_hash: bundle_digest(canonical_policies, canonical_entities),
        })
    }
}

/// The principal entities of an entities file, by id.
fn principals(entities_json: &str) -> std::result::Result<Vec<(String, Value)>, String> {
    let value: Value = serde_json::from_str(entities_json).map_err(|e| e.to_string())?;
    let items = match value {
        Value::Array(items) => items,
        other => vec![other],
    };
    Ok(items
        .into_iter()
        .filter_map(|entity| {
            // Cedar takes a uid as `{"type", "id"}` or as `{"__entity": {"type", "id"}}`.
            let uid = entity.get("uid").map(|u| u.get("__entity").unwrap_or(u));
            let field = |name: &str| uid.and_then(|u| u.get(name)).and_then(Value::as_str);
            let (Some(PRINCIPAL_TYPE), Some(id)) = (field("type"), field("id")) else {
                return None;
            };
            let id = id.to_owned();
            Some((id, entity))
        })
        .collect())
}

/// The verifying keys each principal entity lists in [`VERIFYING_KEYS_ATTR`], by principal id.
fn person_keys(
    entities_json: &str,
) -> std::result::Result<BTreeMap<String, Vec<ed25519_dalek::VerifyingKey>>, String> {
    let mut out = BTreeMap::new();
    for (id, entity) in principals(entities_json)? {
        let Some(keys) = entity.get("attrs").and_then(|a| a.get(VERIFYING_KEYS_ATTR)) else {
            continue;
        };
        let bad = |why: &str| format!("principal {id:?}: {VERIFYING_KEYS_ATTR} {why}");
        let keys = keys
            .as_array()
            .ok_or_else(|| bad("must be a set of hex strings"))?
            .iter()
            .map(|k| {
                let text = k.as_str().ok_or_else(|| bad("must hold strings"))?;
                let bytes: [u8; 32] = hex::decode(text)
                    .ok()
                    .and_then(|b| b.try_into().ok())
                    .ok_or_else(|| bad(&format!("holds {text:?}, not 64 hex digits")))?;
                let key = ed25519_dalek::VerifyingKey::from_bytes(&bytes)
                    .map_err(|e| bad(&format!("holds {text:?}, not an Ed25519 key: {e}")))?;
                // A small-order key verifies signatures anyone can make.
                if key.is_weak() {
                    return Err(bad(&format!("holds {text:?}, a weak (small-order) key")));
                }
                Ok(key)
            })
            .collect::<std::result::Result<Vec<_>, String>>()?;
        if !keys.is_empty() {
            out.insert(id.to_owned(), keys);
        }
    }
    Ok(out)
}

/// Every entity of an entities file (a JSON array) as canonical JSON, sorted.
fn canonical_entities(entities_json: &str) -> std::result::Result<Vec<String>, String> {
    let value: Value = serde_json::from_str(entities_json).map_err(|e| e.to_string())?;
    let items = match value {
        Value::Array(items) => items,
        other => vec![other],
    };
    let mut out: Vec<String> = items.iter().map(sorted_json).collect();
    out.sort_unstable();
    Ok(out)
}

/// `value` as JSON text with every object's keys sorted (by their UTF-8 bytes), no
/// whitespace, strings escaped and numbers written as serde_json writes them: one text per
/// value, whatever order or layout it was written in. Unlike the canonical form of tool
/// arguments (`core::canonical`), it has no depth or integer-range limits, which a valid Cedar
/// policy (a long `||` chain, a 64-bit literal) may exceed.
fn sorted_json(value: &Value) -> String {
    fn write(value: &Value, out: &mut String) {
        match value {
            Value::Object(map) => {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
                out.push('{');
                for (i, (key, item)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String(key.clone()).to_string());
                    out.push(':');
                    write(item, out);
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(item, out);
                }
                out.push(']');
            }
            scalar => out.push_str(&scalar.to_string()),
        }
    }
    let mut out = String::new();
    write(value, &mut out);
    out
}

/// See [`Policy::bundle_hash`].
fn bundle_digest(mut policies: Vec<(String, String)>, entities: Vec<String>) -> String {
    policies.sort_unstable();
    let mut hasher = Sha256::new();
    hasher.update(BUNDLE_HASH_DOMAIN);
    let mut part = |bytes: &[u8]| {
        hasher.update((bytes.len() as u64).to_be_bytes());
        hasher.update(bytes);
    };
    part(&(policies.len() as u64).to_be_bytes());
    for (id, json) in &policies {
        part(id.as_bytes());
        part(json.as_bytes());
    }
    part(&(entities.len() as u64).to_be_bytes());
    for json in &entities {
        part(json.as_bytes());
    }
    hex::encode(hasher.finalize())
}

/// An error and its sources, joined by ": " (Cedar often puts the useful
/// detail in a source).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

/// Cedar's parse messages carry no position through the public API (it sits
/// in `miette` labels), so find the first statement that fails to parse on
/// its own and return the line where it starts. Statements are split at `;`
/// outside string literals and `//` comments, which is all the lexing Cedar
/// policy text needs for this purpose. Diagnostic only: `None` when the
/// statement cannot be pinpointed.
fn locate_parse_error(text: &str) -> Option<usize> {
    let mut chunk_start = 0;
    let mut significant: Option<usize> = None;
    let mut chars = text.char_indices().peekable();
    let check = |start: usize, end: usize, first: Option<usize>| -> Option<usize> {
        let first = first?;
        if PolicySet::from_str(&text[start..end]).is_err() {
            Some(text[..first].matches('\n').count() + 1)
        } else {
            None
        }
    };
    while let Some((index, ch)) = chars.next() {
        match ch {
            '/' if chars.peek().is_some_and(|(_, next)| *next == '/') => {
                // Comment: skip to the end of the line.
                for (_, skipped) in chars.by_ref() {
                    if skipped == '\n' {
                        break;
                    }
                }
            }
            '"' => {
                significant.get_or_insert(index);
                while let Some((_, inner)) = chars.next() {
                    match inner {
                        '\\' => {
                            chars.next();
                        }
                        '"' => break,
                        _ => {}
                    }
                }
            }
            ';' => {
                let end = index + 1;
                if let Some(line) = check(chunk_start, end, significant) {
                    return Some(line);
                }
                chunk_start = end;
                significant = None;
            }
            other if !other.is_whitespace() => {
                significant.get_or_insert(index);
            }
            _ => {}
        }
    }
    check(chunk_start, text.len(), significant)
}

/// Policy sets per tool for one action: a policy scoped to
/// `resource == Airlock::Tool::"x"` is only in x's set; any other resource
/// scope is in every set and in the fallback.
struct ToolIndex {
    per_tool: HashMap<String, (PolicySet, Reads)>,
    /// For tools no policy names.
    fallback: (PolicySet, Reads),
}

impl ToolIndex {
    fn new(per_tool: HashMap<String, PolicySet>, fallback: PolicySet) -> Self {
        let with_reads = |set: PolicySet| {
            let reads = Reads::of(&set);
            (set, reads)
        };
        ToolIndex {
            per_tool: per_tool
                .into_iter()
                .map(|(tool, set)| (tool, with_reads(set)))
                .collect(),
            fallback: with_reads(fallback),
        }
    }

    /// The policies evaluated for `tool` and what they can read of the request context (see
    /// [`context`]), in one map lookup.
    fn entry(&self, tool: &str) -> &(PolicySet, Reads) {
        self.per_tool.get(tool).unwrap_or(&self.fallback)
    }
}

// Manual: Cedar's Debug output dumps every policy's AST several times over.
impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut tools: Vec<(&str, usize)> = self
            .invoke_index
            .per_tool
            .iter()
            .map(|(tool, (set, _))| (tool.as_str(), set.num_of_policies()))
            .collect();
        tools.sort_unstable();
        f.debug_struct("Policy")
            .field("bundle_hash", &self.bundle_hash)
            .field("policies_per_tool", &tools)
            .field(
                "policies_for_other_tools",
                &self.invoke_index.fallback.0.num_of_policies(),
            )
            .field("entities", &self.entities.len())
            .finish_non_exhaustive()
    }
}

fn entity_type(name: &str) -> EntityTypeName {
    EntityTypeName::from_str(name).expect("entity type names are valid constants")
}

fn policy_set(policies: impl Iterator<Item = cedar_policy::Policy>) -> PolicySet {
    let mut set = PolicySet::new();
    for policy in policies {
        set.add(policy)
            .expect("ids were checked unique and every policy is static");
    }
    set
}

/// Which scope constraints of a policy its place in a [`ToolIndex`] already decided.
#[derive(Clone, Copy)]
enum Settled {
    /// The action scope: every request evaluated against an index has that index's action,
    /// and the policy is only there because its action scope admits it.
    Action,
    /// The action scope, and the resource scope `resource == Airlock::Tool::"x"` of a policy
    /// in tool x's own set, whose requests all name tool x.
    ActionAndResource,
}

/// `policy` with the scope constraints its index entry decided (`what`) made unconstrained, so
/// that Cedar does not evaluate them on every request: each is an entity comparison whose
/// answer is known to be true for every request the entry sees. The id and annotations are
/// kept; the policy is rebuilt from its JSON form (Cedar's EST), which also drops its source
/// locations (evaluation errors name the policy by id; their messages carry no location).
/// `index_agrees_with_unindexed_evaluation` checks that the indexed sets decide, and err,
/// exactly like the policies as written.
fn settled(policy: &cedar_policy::Policy, what: Settled) -> Result<cedar_policy::Policy> {
    let rebuild_error = |message: String| Error::Parse {
        origin: format!("policy {} (rebuilt for the index)", policy.id()),
        message,
    };
    let mut est = policy
        .to_json()
        .map_err(|error| rebuild_error(error_chain(&error)))?;
    let all = serde_json::json!({ "op": "All" });
    est["action"] = all.clone();
    if let Settled::ActionAndResource = what {
        est["resource"] = all;
    }
    cedar_policy::Policy::from_json(Some(policy.id().clone()), est)
        .map_err(|error| rebuild_error(error_chain(&error)))
}

/// Whether an action scope can match `action`. `in` also matches
/// descendants per the entity hierarchy, so consult it.
fn admits(constraint: &ActionConstraint, action: &EntityUid, entities: &Entities) -> bool {
    match constraint {
        ActionConstraint::Any => true,
        ActionConstraint::Eq(uid) => uid == action,
        ActionConstraint::In(uids) => uids
            .iter()
            .any(|uid| uid == action || entities.is_ancestor_of(uid, action)),
    }
}

fn sorted_ids<'a>(ids: impl Iterator<Item = &'a PolicyId>) -> Vec<String> {
    let mut ids: Vec<String> = ids.map(ToString::to_string).collect();
    ids.sort();
    ids
}

/// Evaluation errors joined in a deterministic order, or `None`.
fn sorted_errors(response: &cedar_policy::Response) -> Option<String> {
    let mut errors: Vec<String> = response
        .diagnostics()
        .errors()
        .map(ToString::to_string)
        .collect();
    if errors.is_empty() {
        return None;
    }
    errors.sort();
    Some(errors.join("; "))
}

/// Reason for a Cedar Deny: matched forbids first; otherwise errors (an
/// erroring forbid or permit is more informative than "no permit").
fn deny_reason(determining: Vec<String>, errors: Option<String>) -> DenyReason {
    if !determining.is_empty() {
        DenyReason::Forbidden {
            policies: determining,
        }
    } else if let Some(errors) = errors {
        DenyReason::Invalid(errors)
    } else {
        DenyReason::NoPermit
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn testdata(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata")
            .join(name)
    }

    fn sources() -> (String, String) {
        (
            std::fs::read_to_string(testdata("policies.cedar")).unwrap(),
            std::fs::read_to_string(testdata("entities.json")).unwrap(),
        )
    }

    fn bundle() -> Policy {
        Policy::load(&testdata("policies.cedar"), &testdata("entities.json")).unwrap()
    }

    fn entities() -> String {
        sources().1
    }

    /// Entities JSON naming `ids` as principals without attributes or roles.
    fn registered(ids: &[&str]) -> String {
        let principals: Vec<Value> = ids
            .iter()
            .map(
                |id| json!({"uid": {"type": PRINCIPAL_TYPE, "id": id}, "attrs": {}, "parents": []}),
            )
            .collect();
        Value::Array(principals).to_string()
    }

    fn refund_args(minor_units: i64) -> Value {
        json!({
            "account_id": "acct_1234",
            "amount": { "currency": "EUR", "minor_units": minor_units },
            "charge_id": "ch_5678",
            "reason": "duplicate",
            "tenant_id": "t1"
        })
    }

    fn request<'a>(
        principal: &'a str,
        tenant: &'a str,
        tool: &'a str,
        arguments: &'a Value,
    ) -> AuthzRequest<'a> {
        AuthzRequest {
            principal,
            tenant,
            tool,
            tool_version: "1",
            resource: "acct_1234",
            run_id: "run-1",
            arguments,
        }
    }

    fn auto(ids: &[&str]) -> Authz {
        Authz::Auto {
            policies: ids.iter().map(|id| (*id).to_owned()).collect(),
        }
    }

    fn approval(ids: &[&str]) -> Authz {
        Authz::Approval {
            policies: ids.iter().map(|id| (*id).to_owned()).collect(),
        }
    }

    fn forbidden(ids: &[&str]) -> DenyReason {
        DenyReason::Forbidden {
            policies: ids.iter().map(|id| (*id).to_owned()).collect(),
        }
    }

    fn denied(reason: DenyReason) -> Authz {
        Authz::Deny { reason }
    }

    fn invoke(policy: &Policy, principal: &str, tenant: &str, tool: &str, args: &Value) -> Authz {
        policy.authorize_invoke(&request(principal, tenant, tool, args))
    }

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn policy_is_shareable_across_threads() {
        assert_send_sync::<Policy>();
    }

    #[test]
    fn refund_tiers_by_amount() {
        let policy = bundle();
        let agent = "agent-support-t1";
        for (amount, expected) in [
            (1, auto(&["refund-auto-small"])),
            (10_000, auto(&["refund-auto-small"])),
            (10_001, approval(&["refund-approval-medium"])),
            (500_000, approval(&["refund-approval-medium"])),
            (500_001, denied(forbidden(&["refund-forbid-large"]))),
        ] {
            assert_eq!(
                invoke(&policy, agent, "t1", "refund", &refund_args(amount)),
                expected,
                "amount {amount}"
            );
        }
    }

    #[test]
    fn no_permit_and_unknown_principal() {
        let policy = bundle();
        let args = refund_args(100);
        // Same tenant, but no role that permits refunds.
        assert_eq!(
            invoke(&policy, "agent-readonly-t1", "t1", "refund", &args),
            denied(DenyReason::NoPermit)
        );
        // Not in the entities file: refused before any policy is evaluated.
        assert_eq!(
            invoke(&policy, "ghost", "t1", "refund", &args),
            denied(DenyReason::UnknownPrincipal("ghost".to_owned()))
        );
        // A tool no policy names: only the global policies apply.
        assert_eq!(
            invoke(&policy, "agent-support-t1", "t1", "wire_transfer", &args),
            denied(DenyReason::NoPermit)
        );
    }

    /// A permit with no role constraint, and an isolation forbid that only applies to
    /// principals with a tenant: an identity nobody registered would pass both, for any
    /// tenant, if policies were evaluated for it.
    #[test]
    fn an_unknown_principal_is_refused_whatever_the_policies_permit() {
        let policy = Policy::from_sources(
            r#"
            @id("isolation") forbid (principal, action, resource)
            when { principal has tenant && principal.tenant != context.tenant };
            @id("anyone") @tier("auto") permit (principal, action, resource);
            "#,
            &entities(),
        )
        .unwrap();
        let args = refund_args(100);
        assert_eq!(
            invoke(&policy, "agent-support-t1", "t1", "refund", &args),
            auto(&["anyone"])
        );
        assert_eq!(
            invoke(&policy, "ghost", "t2", "refund", &args),
            denied(DenyReason::UnknownPrincipal("ghost".to_owned()))
        );
        assert_eq!(
            policy.authorize_approve(&request("ghost", "t1", "refund", &args)),
            Err(DenyReason::UnknownPrincipal("ghost".to_owned()))
        );
    }

    #[test]
    fn cross_tenant_is_denied() {
        let policy = bundle();
        let args = refund_args(100);
        assert_eq!(
            invoke(&policy, "agent-support-t2", "t1", "refund", &args),
            denied(forbidden(&["tenant-isolation"]))
        );
        assert_eq!(
            invoke(&policy, "agent-support-t1", "t2", "refund", &args),
            denied(forbidden(&["tenant-isolation"]))
        );
        // Both forbids are reported when both match.
        assert_eq!(
            invoke(
                &policy,
                "agent-support-t2",
                "t1",
                "refund",
                &refund_args(900_000)
            ),
            denied(forbidden(&["refund-forbid-large", "tenant-isolation"]))
        );
        assert_eq!(
            invoke(&policy, "agent-support-t2", "t2", "refund", &args),
            auto(&["refund-auto-small"])
        );
    }

    #[test]
    fn debit_and_email() {
        let policy = bundle();
        let debit = json!({"tenant_id": "t1", "account_id": "acct_1", "amount": {"minor_units": 1, "currency": "EUR"}, "reference": "r"});
        assert_eq!(
            invoke(&policy, "agent-billing-t1", "t1", "debit", &debit),
            approval(&["debit-always-approval"])
        );
        assert_eq!(
            invoke(&policy, "agent-support-t1", "t1", "debit", &debit),
            denied(DenyReason::NoPermit)
        );
        let internal =
            json!({"tenant_id": "t1", "to": "ops@acme.example", "subject": "s", "body": "b"});
        let external =
            json!({"tenant_id": "t1", "to": "someone@gmail.example", "subject": "s", "body": "b"});
        assert_eq!(
            invoke(&policy, "agent-support-t1", "t1", "send_email", &internal),
            auto(&["email-internal-auto"])
        );
        assert_eq!(
            invoke(&policy, "agent-support-t1", "t1", "send_email", &external),
            approval(&["email-external-approval"])
        );
    }

    #[test]
    fn approvers() {
        let policy = bundle();
        let args = refund_args(20_000);
        let approve = |principal: &str, tenant: &str, tool: &str| {
            policy.authorize_approve(&request(principal, tenant, tool, &args))
        };
        assert_eq!(approve("alice", "t1", "refund"), Ok(()));
        assert_eq!(approve("bob", "t1", "refund"), Ok(()));
        assert_eq!(approve("alice", "t1", "debit"), Ok(()));
        assert_eq!(approve("bob", "t1", "send_email"), Ok(()));
        assert_eq!(approve("dave", "t1", "refund"), Err(DenyReason::NoPermit));
        assert_eq!(
            approve("alice", "t1", "send_email"),
            Err(DenyReason::NoPermit)
        );
        // Agents cannot approve, even their own proposals.
        assert_eq!(
            approve("agent-support-t1", "t1", "refund"),
            Err(DenyReason::NoPermit)
        );
        // A finance approver of another tenant is not entitled.
        assert_eq!(
            approve("carol", "t1", "refund"),
            Err(forbidden(&["tenant-isolation"]))
        );
        assert_eq!(approve("carol", "t2", "refund"), Ok(()));
        // Approving is not invoking: approvers cannot invoke.
        assert_eq!(
            invoke(&policy, "alice", "t1", "refund", &args),
            denied(DenyReason::NoPermit)
        );
    }

    #[test]
    fn nulls_are_stripped_from_objects() {
        let policy = bundle();
        let mut args = refund_args(100);
        args["note"] = Value::Null;
        args["amount"]["previous"] = Value::Null;
        args["meta"] = json!({"a": null, "b": [{"c": null}]});
        assert_eq!(
            invoke(&policy, "agent-support-t1", "t1", "refund", &args),
            auto(&["refund-auto-small"])
        );
        // Stripped means absent: `has` is false.
        let custom = Policy::from_sources(
            r#"@tier("auto") permit (principal, action, resource)
               unless { context.arguments has note };"#,
            &registered(&["p", "mallory"]),
        )
        .unwrap();
        assert!(matches!(
            invoke(&custom, "p", "t1", "refund", &args),
            Authz::Auto { .. }
        ));
        // Null as the whole arguments value: the field is dropped, so a
        // policy reading it errors, and the request fails closed.
        let outcome = invoke(&custom, "p", "t1", "refund", &Value::Null);
        assert!(
            matches!(&outcome, Authz::Deny { reason: DenyReason::Invalid(m) } if m.contains("arguments")),
            "{outcome:?}"
        );
    }

    #[test]
    fn null_in_array_and_floats_are_invalid() {
        let policy = bundle();
        let mut args = refund_args(100);
        args["tags"] = json!(["a", null]);
        let Authz::Deny {
            reason: DenyReason::Invalid(message),
        } = invoke(&policy, "agent-support-t1", "t1", "refund", &args)
        else {
            panic!("null inside an array must deny");
        };
        assert!(message.contains("/arguments/tags/1"), "{message}");
        assert!(message.contains("null"), "{message}");

        let mut args = refund_args(100);
        args["rate"] = json!(1.5);
        let outcome = invoke(&policy, "agent-support-t1", "t1", "refund", &args);
        assert!(
            matches!(&outcome, Authz::Deny { reason: DenyReason::Invalid(m) } if m.contains("/arguments/rate")),
            "{outcome:?}"
        );
        let outcome = policy.authorize_approve(&request("alice", "t1", "refund", &args));
        assert!(
            matches!(outcome, Err(DenyReason::Invalid(_))),
            "{outcome:?}"
        );
    }

    #[test]
    fn json_escapes_in_arguments_are_plain_records() {
        // Cedar's JSON context parser would turn this into an entity
        // reference equal to the principal; we must not.
        let policy = Policy::from_sources(
            r#"@id("owner") @tier("auto")
               permit (principal, action, resource)
               when { context.arguments.owner == principal };"#,
            &registered(&["p", "mallory"]),
        )
        .unwrap();
        let args = json!({"owner": {"__entity": {"type": "Airlock::Principal", "id": "mallory"}}});
        assert_eq!(
            invoke(&policy, "mallory", "t1", "refund", &args),
            denied(DenyReason::NoPermit)
        );
        let args = json!({"owner": {"__extn": {"fn": "ip", "arg": "10.0.0.1"}}});
        assert_eq!(
            invoke(&policy, "mallory", "t1", "refund", &args),
            denied(DenyReason::NoPermit)
        );
    }

    #[test]
    fn context_carries_all_request_fields() {
        let policy = Policy::from_sources(
            r#"@id("all-fields") @tier("auto")
               permit (principal == Airlock::Principal::"p", action == Airlock::Action::"invoke", resource == Airlock::Tool::"refund")
               when {
                 context.tenant == "t9" && context.tool_version == "1" &&
                 context.resource == "acct_1234" && context.run_id == "run-1" &&
                 context.arguments.amount.minor_units == 100
               };"#,
            &registered(&["p", "mallory"]),
        )
        .unwrap();
        assert_eq!(
            invoke(&policy, "p", "t9", "refund", &refund_args(100)),
            auto(&["all-fields"])
        );
    }

    #[test]
    fn evaluation_errors_fail_closed() {
        let policies = r#"
            @id("allow-all") @tier("auto")
            permit (principal, action, resource);

            @id("broken-forbid")
            forbid (principal, action, resource == Airlock::Tool::"refund")
            when { context.arguments.no_such_field > 1 };

            @id("forbid-big")
            forbid (principal, action, resource == Airlock::Tool::"debit")
            when { context.arguments.amount > 10 };

            @id("broken-debit")
            forbid (principal, action, resource == Airlock::Tool::"debit")
            when { context.arguments.no_such_field > 1 };
        "#;
        let policy = Policy::from_sources(policies, &registered(&["p", "mallory"])).unwrap();
        // Allowed, but the erroring forbid might have denied: deny.
        let outcome = invoke(&policy, "p", "t1", "refund", &json!({}));
        assert!(
            matches!(&outcome, Authz::Deny { reason: DenyReason::Invalid(m) } if m.contains("broken-forbid")),
            "{outcome:?}"
        );
        let approve = policy.authorize_approve(&request("p", "t1", "refund", &json!({})));
        assert!(
            matches!(approve, Err(DenyReason::Invalid(_))),
            "{approve:?}"
        );
        // Denied anyway by a matching forbid: report the forbid.
        assert_eq!(
            invoke(&policy, "p", "t1", "debit", &json!({"amount": 11})),
            denied(forbidden(&["forbid-big"]))
        );
        // Deny with only errors: the errors are the reason.
        let outcome = invoke(&policy, "p", "t1", "debit", &json!({"amount": 1}));
        assert!(
            matches!(&outcome, Authz::Deny { reason: DenyReason::Invalid(m) } if m.contains("broken-debit")),
            "{outcome:?}"
        );
        // Other tools are unaffected.
        assert_eq!(
            invoke(&policy, "p", "t1", "send_email", &json!({})),
            auto(&["allow-all"])
        );
    }

    /// The invoke index holds the tool's own policies and the general ones whose action scope
    /// admits invoke; approve-only permits are evaluated for approvals only.
    #[test]
    fn index_evaluates_only_policies_for_the_tool() {
        let policy = bundle();
        assert_eq!(
            policy.applicable_policy_ids("refund"),
            [
                "refund-approval-medium",
                "refund-auto-small",
                "refund-forbid-large",
                "tenant-isolation"
            ]
        );
        assert_eq!(
            policy.applicable_policy_ids("send_email"),
            [
                "email-external-approval",
                "email-internal-auto",
                "tenant-isolation"
            ]
        );
        assert_eq!(
            policy.applicable_policy_ids("unknown"),
            ["tenant-isolation"]
        );

        // A policy for send_email that errors whenever evaluated does not
        // affect refund, while it does deny send_email (fail closed).
        let (policies, entities) = sources();
        let policies = format!(
            "{policies}\n@id(\"email-broken\")\nforbid (principal, action, resource == Airlock::Tool::\"send_email\")\nwhen {{ context.arguments.no_such_field == 1 }};\n"
        );
        let policy = Policy::from_sources(&policies, &entities).unwrap();
        assert!(
            !policy
                .applicable_policy_ids("refund")
                .contains(&"email-broken".to_owned())
        );
        assert_eq!(
            invoke(&policy, "agent-support-t1", "t1", "refund", &refund_args(5)),
            auto(&["refund-auto-small"])
        );
        let email = json!({"to": "ops@acme.example"});
        let outcome = invoke(&policy, "agent-support-t1", "t1", "send_email", &email);
        assert!(
            matches!(&outcome, Authz::Deny { reason: DenyReason::Invalid(m) } if m.contains("email-broken")),
            "{outcome:?}"
        );
    }

    #[test]
    fn index_scopes_in_and_is_apply_to_every_tool() {
        let policies = r#"
            @id("in-scope") @tier("auto")
            permit (principal, action, resource in Airlock::Tool::"refund");
            @id("is-scope") @tier("approval")
            permit (principal, action, resource is Airlock::Tool);
            @id("other-type")
            forbid (principal, action, resource == Other::"refund");
            @id("only-debit") @tier("auto")
            permit (principal, action, resource == Airlock::Tool::"debit");
        "#;
        let policy = Policy::from_sources(policies, &registered(&["p", "mallory"])).unwrap();
        assert_eq!(
            policy.applicable_policy_ids("refund"),
            ["in-scope", "is-scope", "other-type"]
        );
        assert_eq!(
            policy.applicable_policy_ids("debit"),
            ["in-scope", "is-scope", "only-debit", "other-type"]
        );
        assert_eq!(
            invoke(&policy, "p", "t", "refund", &json!({})),
            approval(&["in-scope", "is-scope"])
        );
    }

    /// Evaluates every request of `principals` × `tools` × tenants `t1`, `t2` × `arguments`,
    /// for both actions, through the index and through the policies as parsed from `policies`
    /// (named by their `@id`, as decisions name them), and asserts the same decision, the same
    /// determining policies and the same errors. Returns how many requests it compared.
    fn assert_index_agrees(
        policies: &str,
        entities: &str,
        principals: &[&str],
        tools: &[&str],
        arguments: &[Value],
    ) -> usize {
        let policy = Policy::from_sources(policies, entities).unwrap();
        let whole = policy_set(PolicySet::from_str(policies).unwrap().policies().map(|p| {
            let id = p
                .annotation("id")
                .map_or_else(|| p.id().clone(), PolicyId::new);
            p.new_id(id)
        }));
        let mut compared = 0;
        for principal in principals {
            for tool in tools {
                for tenant in ["t1", "t2"] {
                    for args in arguments {
                        let req = request(principal, tenant, tool, args);
                        let actions = [
                            (&policy.invoke, &policy.invoke_index),
                            (&policy.approve, &policy.approve_index),
                            (&policy.settle, &policy.settle_index),
                            (&policy.cancel, &policy.cancel_index),
                        ];
                        for (action, index) in actions {
                            let indexed = match policy.evaluate(&req, action, index) {
                                Ok(response) => response,
                                // Refused before the index is consulted: the same answer
                                // either way.
                                Err(DenyReason::UnknownPrincipal(_)) => {
                                    compared += 1;
                                    continue;
                                }
                                Err(e) => panic!("{e}"),
                            };
                            let context = context::build(&req, &Reads::All).unwrap();
                            let full_request = Request::new(
                                EntityUid::from_type_name_and_id(
                                    policy.principal_type.clone(),
                                    EntityId::new(*principal),
                                ),
                                action.clone(),
                                EntityUid::from_type_name_and_id(
                                    policy.tool_type.clone(),
                                    EntityId::new(*tool),
                                ),
                                context,
                                None,
                            )
                            .unwrap();
                            let full = policy.authorizer.is_authorized(
                                &full_request,
                                &whole,
                                &policy.entities,
                            );
                            let what = format!("{principal} {action} {tool} {tenant} {args}");
                            assert_eq!(indexed.decision(), full.decision(), "{what}");
                            assert_eq!(
                                sorted_ids(indexed.diagnostics().reason()),
                                sorted_ids(full.diagnostics().reason()),
                                "{what}"
                            );
                            assert_eq!(sorted_errors(&indexed), sorted_errors(&full), "{what}");
                            compared += 1;
                        }
                    }
                }
            }
        }
        compared
    }

    /// Inside the index, no policy keeps an action scope, and a tool's own policies keep no
    /// resource scope (the reference bundle's general policies have none); general policies
    /// keep theirs (`in`, `is`, another type).
    #[test]
    fn index_drops_the_scopes_it_settles() {
        let policy = bundle();
        for index in [
            &policy.invoke_index,
            &policy.approve_index,
            &policy.settle_index,
            &policy.cancel_index,
        ] {
            for (tool, (set, _)) in &index.per_tool {
                for p in set.policies() {
                    assert_eq!(p.action_constraint(), ActionConstraint::Any, "{}", p.id());
                    assert_eq!(
                        p.resource_constraint(),
                        ResourceConstraint::Any,
                        "{tool}: {}",
                        p.id()
                    );
                }
            }
        }
        let policies = r#"
            @id("is-tool") @tier("approval")
            permit (principal, action == Airlock::Action::"invoke", resource is Airlock::Tool);
        "#;
        let policy = Policy::from_sources(policies, &registered(&["p", "mallory"])).unwrap();
        let (set, _) = &policy.invoke_index.fallback;
        let p = set.policies().next().unwrap();
        assert_eq!(p.action_constraint(), ActionConstraint::Any);
        assert!(matches!(p.resource_constraint(), ResourceConstraint::Is(_)));
    }

    /// The index is an optimisation only: its sets, with the scope constraints they settle
    /// dropped, must decide and err exactly like the whole policy set as written.
    #[test]
    fn index_agrees_with_unindexed_evaluation() {
        let (policies, entities) = sources();
        let principals = [
            "agent-support-t1",
            "agent-support-t2",
            "agent-billing-t1",
            "agent-readonly-t1",
            "alice",
            "bob",
            "carol",
            "dave",
            "ghost",
        ];
        let tools = ["refund", "debit", "send_email", "unknown"];
        let arguments: Vec<Value> = [1, 10_000, 10_001, 500_001]
            .into_iter()
            .map(|amount| {
                json!({
                    "amount": {"minor_units": amount, "currency": "EUR"},
                    "to": if amount > 10_000 { "x@other.example" } else { "x@acme.example" }
                })
            })
            .collect();
        let compared = assert_index_agrees(&policies, &entities, &principals, &tools, &arguments);
        // principals × tools × tenants × arguments × actions (invoke, approve, settle, cancel)
        assert_eq!(compared, 9 * 4 * 2 * 4 * 4);
    }

    /// The same over scopes the reference bundle does not use: `in` and `is` resources, action
    /// lists and hierarchies, `==` another type, and conditions that err (a missing attribute,
    /// a type error) in permits and forbids, general and tool-specific: dropping the settled
    /// scopes changes no decision and no error message.
    #[test]
    fn index_agrees_with_unindexed_evaluation_over_other_scopes_and_errors() {
        let policies = r#"
            @id("in-refund") @tier("auto")
            permit (principal, action in [Airlock::Action::"invoke"], resource in Airlock::Tool::"refund")
            when { context.arguments.amount < 100 };
            @id("is-tool") @tier("approval")
            permit (principal in Airlock::Role::"agent", action, resource is Airlock::Tool)
            when { context.arguments.amount >= 100 };
            @id("other-type")
            forbid (principal, action, resource == Other::"refund");
            @id("debit-errs") @tier("auto")
            permit (principal, action == Airlock::Action::"invoke", resource == Airlock::Tool::"debit")
            when { context.arguments.no_such_field > 1 };
            @id("debit-type-error")
            forbid (principal, action in [Airlock::Action::"invoke", Airlock::Action::"approve"], resource == Airlock::Tool::"debit")
            when { context.arguments.amount like "1*" };
            @id("refund-approvers")
            permit (principal in Airlock::Role::"agent", action == Airlock::Action::"approve", resource == Airlock::Tool::"refund")
            when { principal has tenant && principal.tenant == context.tenant };
            @id("tenant-guard")
            forbid (principal, action, resource)
            unless { principal has tenant && principal.tenant == context.tenant };
        "#;
        let entities = r#"[
            { "uid": { "type": "Airlock::Role", "id": "agent" }, "attrs": {}, "parents": [] },
            { "uid": { "type": "Airlock::Principal", "id": "a1" }, "attrs": { "tenant": "t1" },
              "parents": [ { "type": "Airlock::Role", "id": "agent" } ] },
            { "uid": { "type": "Airlock::Principal", "id": "x" }, "attrs": {}, "parents": [] }
        ]"#;
        let arguments = [
            json!({"amount": 5}),
            json!({"amount": 500}),
            json!({"amount": "text"}),
            json!({}),
        ];
        let compared = assert_index_agrees(
            policies,
            entities,
            &["a1", "x", "ghost"],
            &["refund", "debit", "send_email"],
            &arguments,
        );
        assert_eq!(compared, 3 * 3 * 2 * 4 * 4);
    }

    /// A principal's `verifying_keys` are parsed at load; anything that is not a usable Ed25519
    /// key (not hex, not 32 bytes, a small-order point anyone can sign for) fails the load.
    #[test]
    fn person_keys_are_registered_valid_or_refused_at_load() {
        let (policies, _) = sources();
        let with_keys = |keys: Value| {
            json!([{"uid": {"type": PRINCIPAL_TYPE, "id": "alice"},
                    "attrs": {"tenant": "t1", VERIFYING_KEYS_ATTR: keys}, "parents": []},
                   {"uid": {"type": PRINCIPAL_TYPE, "id": "bob"}, "attrs": {}, "parents": []}])
            .to_string()
        };
        let good = ed25519_dalek::SigningKey::from_bytes(&[7; 32]).verifying_key();
        let policy =
            Policy::from_sources(&policies, &with_keys(json!([hex::encode(good.to_bytes())])))
                .unwrap();
        assert_eq!(policy.person_keys("alice"), Some([good].as_slice()));
        assert_eq!(policy.person_keys("bob"), None);
        assert_eq!(policy.people_with_keys(), 1);
        let mut identity = [0u8; 32];
        identity[0] = 1;
        for bad in [
            json!("not a set"),
            json!(["zz"]),
            json!([hex::encode([7u8; 31])]),
            json!([hex::encode(identity)]),
        ] {
            let err = Policy::from_sources(&policies, &with_keys(bad.clone())).unwrap_err();
            assert!(
                err.to_string().contains(VERIFYING_KEYS_ATTR),
                "{bad}: {err}"
            );
        }
    }

    /// The bundle hash has no limits of its own: a 64-bit literal and a long `||` chain (deep
    /// in Cedar's JSON form), both valid Cedar, load.
    #[test]
    fn any_valid_bundle_has_a_hash() {
        let (policies, entities) = sources();
        // 34 terms nest about 80 deep in Cedar's JSON form (past the argument canonicalizer's
        // 64). Cedar's own parser recurses deeper than a test thread's stack allows in a debug
        // build, so this runs on a thread with a main thread's 8 MiB.
        let chain: Vec<String> = (0..34)
            .map(|i| format!("context.arguments.amount.minor_units == {i}"))
            .collect();
        let extra = format!(
            "@id(\"huge\")\nforbid (principal, action, resource)\n\
             when {{ context.arguments.amount.minor_units > 9223372036854775807 }};\n\
             @id(\"chain\")\nforbid (principal, action, resource)\nwhen {{ {} }};\n",
            chain.join(" || ")
        );
        let hash = std::thread::Builder::new()
            .stack_size(8 << 20)
            .spawn(move || {
                Policy::from_sources(&format!("{policies}\n{extra}"), &entities)
                    .map(|p| p.bundle_hash().to_owned())
            })
            .unwrap()
            .join()
            .unwrap()
            .unwrap();
        assert_ne!(hash, bundle().bundle_hash());
    }

    #[test]
    fn bundle_hash_is_stable_and_sensitive() {
        let (policies, entities) = sources();
        let a = Policy::from_sources(&policies, &entities).unwrap();
        let b = Policy::from_sources(&policies, &entities).unwrap();
        assert_eq!(a.bundle_hash(), b.bundle_hash());
        assert_eq!(a.bundle_hash(), bundle().bundle_hash());
        assert_eq!(a.bundle_hash().len(), 64);
        assert!(
            a.bundle_hash()
                .chars()
                .all(|c| matches!(c, '0'..='9' | 'a'..='f'))
        );

        // How the bundle is written changes nothing: comments, layout, the order of policies
        // that carry their own `@id`, the order and key order of entities.
        let same =
            |p: &str, e: &str| Policy::from_sources(p, e).unwrap().bundle_hash() == a.bundle_hash();
        assert!(same(&format!("// reviewed\n{policies}\n\n  "), &entities));
        assert!(same(&policies.replace('\n', "\n\n"), &entities));
        let (first, rest) = policies.split_once("\n@id(\"refund-auto-small\")").unwrap();
        let moved = format!("@id(\"refund-auto-small\"){rest}\n{first}");
        assert!(same(&moved, &entities), "the first policy moved to the end");
        let mut list: Vec<Value> = serde_json::from_str(&entities).unwrap();
        list.reverse();
        assert!(same(
            &policies,
            &serde_json::to_string_pretty(&list).unwrap()
        ));

        // What it says changes it: a limit, an entity.
        assert!(!same(&policies.replace("<= 10000", "<= 10001"), &entities));
        assert!(!same(
            &policies,
            &serde_json::to_string(&list[1..]).unwrap()
        ));

        // Length and count prefixes: moving bytes across a boundary changes the hash.
        let digest = |p: &[(&str, &str)], e: &[&str]| {
            bundle_digest(
                p.iter()
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .collect(),
                e.iter().map(|s| s.to_string()).collect(),
            )
        };
        assert_ne!(digest(&[("ab", "c")], &[]), digest(&[("a", "bc")], &[]));
        assert_ne!(
            digest(&[("a", "b")], &["c"]),
            digest(&[("a", "b"), ("c", "")], &[])
        );
    }

    fn load_error(policies: &str) -> Error {
        Policy::from_sources(policies, &entities()).unwrap_err()
    }

    #[test]
    fn rejects_parse_errors_with_cedar_message() {
        let error = load_error("permit (principal, action, resource) when { context.x == };");
        let Error::Parse { origin, message } = &error else {
            panic!("expected a parse error, got {error}");
        };
        assert_eq!(origin, "<inline>");
        assert!(!message.is_empty());
        let error =
            Policy::load(&testdata("entities.json"), &testdata("entities.json")).unwrap_err();
        assert!(
            matches!(&error, Error::Parse { origin, .. } if origin.ends_with("entities.json")),
            "{error}"
        );
    }

    #[test]
    fn parse_errors_name_the_line_of_the_failing_policy() {
        let text = "// header; with a semicolon\n\
                    @id(\"a;\") @tier(\"auto\")\n\
                    permit (principal, action, resource) when { context.s == \"x;\\\"y\" };\n\
                    \n\
                    @id(\"b\")\n\
                    forbid (principal, acton, resource);\n";
        let error = Policy::from_sources(text, "[]").unwrap_err();
        let Error::Parse { message, .. } = &error else {
            panic!("expected a parse error, got {error}");
        };
        assert!(
            message.starts_with("in the policy starting at line 5:"),
            "{message}"
        );
        assert_eq!(
            locate_parse_error("@tier(\"auto\") permit (principal, action, resource);"),
            None
        );
        assert_eq!(
            locate_parse_error("permit (principal, action, resource);\n// end\n"),
            None
        );
        assert_eq!(
            locate_parse_error("permit (principal, action, resource)"),
            Some(1)
        );
        assert_eq!(
            locate_parse_error("\n\npermit (principal, action, resource"),
            Some(3)
        );
    }

    #[test]
    fn debug_is_compact() {
        let text = format!("{:?}", bundle());
        assert!(text.len() < 400, "{text}");
        assert!(text.contains("bundle_hash"));
    }

    #[test]
    fn rejects_templates() {
        let error = load_error(
            r#"@id("tmpl") @tier("auto") permit (principal == ?principal, action, resource);"#,
        );
        assert!(
            matches!(&error, Error::Template { policy } if policy == "tmpl"),
            "{error}"
        );
    }

    #[test]
    fn rejects_missing_unknown_and_misplaced_tiers() {
        for text in [
            r#"@id("p") permit (principal, action == Airlock::Action::"invoke", resource);"#,
            r#"@id("p") permit (principal, action, resource);"#,
            r#"@id("p") permit (principal, action in [Airlock::Action::"approve", Airlock::Action::"invoke"], resource);"#,
        ] {
            let error = load_error(text);
            assert!(
                matches!(&error, Error::MissingTier { policy } if policy == "p"),
                "{text}: {error}"
            );
        }
        let error = load_error(r#"@id("p") @tier("manual") permit (principal, action, resource);"#);
        assert!(
            matches!(&error, Error::UnknownTier { policy, tier } if policy == "p" && tier == "manual"),
            "{error}"
        );
        let error = load_error(r#"@id("p") @tier permit (principal, action, resource);"#);
        assert!(
            matches!(&error, Error::UnknownTier { tier, .. } if tier.is_empty()),
            "{error}"
        );
        let error = load_error(r#"@id("f") @tier("auto") forbid (principal, action, resource);"#);
        assert!(
            matches!(&error, Error::TierOnForbid { policy, tier } if policy == "f" && tier == "auto"),
            "{error}"
        );
        // Without @id, Cedar's positional id names the policy.
        let error = load_error(
            r#"@id("ok") @tier("auto") permit (principal, action, resource);
               permit (principal, action, resource);"#,
        );
        assert!(
            matches!(&error, Error::MissingTier { policy } if policy == "policy1"),
            "{error}"
        );
    }

    #[test]
    fn approve_only_permits_need_no_tier() {
        for text in [
            r#"permit (principal, action == Airlock::Action::"approve", resource);"#,
            r#"permit (principal, action in [Airlock::Action::"approve"], resource);"#,
        ] {
            Policy::from_sources(text, "[]").unwrap();
        }
        // ...unless the entity hierarchy makes invoke a member of approve.
        let entities = r#"[
            {"uid": {"type": "Airlock::Action", "id": "approve"}, "attrs": {}, "parents": []},
            {"uid": {"type": "Airlock::Action", "id": "invoke"}, "attrs": {}, "parents": [{"type": "Airlock::Action", "id": "approve"}]}
        ]"#;
        let error = Policy::from_sources(
            r#"@id("sneaky") permit (principal, action in Airlock::Action::"approve", resource);"#,
            entities,
        )
        .unwrap_err();
        assert!(
            matches!(&error, Error::MissingTier { policy } if policy == "sneaky"),
            "{error}"
        );
    }

    #[test]
    fn rejects_bad_ids() {
        let error = load_error(r#"@id("") @tier("auto") permit (principal, action, resource);"#);
        assert!(
            matches!(&error, Error::EmptyId { policy } if policy == "policy0"),
            "{error}"
        );
        let error = load_error(
            r#"@id("same") @tier("auto") permit (principal, action, resource);
               @id("same") forbid (principal, action, resource);"#,
        );
        assert!(
            matches!(&error, Error::DuplicateId { policy } if policy == "same"),
            "{error}"
        );
        // An @id colliding with another policy's positional id.
        let error = load_error(
            r#"@id("policy1") @tier("auto") permit (principal, action, resource);
               forbid (principal, action, resource);"#,
        );
        assert!(
            matches!(&error, Error::DuplicateId { policy } if policy == "policy1"),
            "{error}"
        );
    }

    #[test]
    fn rejects_bad_entities_and_unreadable_files() {
        let (policies, _) = sources();
        for entities in [
            "not json",
            "{}",
            r#"[{"uid": {"type": "Airlock::Principal"}}]"#,
        ] {
            let error = Policy::from_sources(&policies, entities).unwrap_err();
            assert!(
                matches!(error, Error::Entities { .. }),
                "{entities}: {error}"
            );
        }
        let error =
            Policy::load(&testdata("missing.cedar"), &testdata("entities.json")).unwrap_err();
        assert!(
            matches!(&error, Error::Read { path, .. } if path.ends_with("missing.cedar")),
            "{error}"
        );
        let error =
            Policy::load(&testdata("policies.cedar"), &testdata("missing.json")).unwrap_err();
        assert!(
            matches!(&error, Error::Read { path, .. } if path.ends_with("missing.json")),
            "{error}"
        );
    }

    #[test]
    fn summaries() {
        assert_eq!(auto(&["a", "b"]).summary(), "allowed automatically by a, b");
        assert_eq!(
            approval(&["m"]).summary(),
            "allowed subject to approval by m"
        );
        assert_eq!(
            denied(forbidden(&["f"])).summary(),
            "denied: forbidden by f"
        );
        assert_eq!(
            denied(DenyReason::NoPermit).summary(),
            "denied: no policy permits it"
        );
        assert_eq!(
            denied(DenyReason::Invalid("boom".into())).summary(),
            "denied: request could not be evaluated: boom"
        );
    }

    /// Not a benchmark and not timed: 10k authorizations must simply finish,
    /// catching accidental quadratic work (e.g. cloning the policy set per call).
    #[test]
    fn ten_thousand_authorizations() {
        let policy = bundle();
        let mut counts = [0usize; 3];
        for i in 0..10_000i64 {
            let args = refund_args(i * 100);
            let outcome = invoke(&policy, "agent-support-t1", "t1", "refund", &args);
            let slot = match outcome {
                Authz::Auto { .. } => 0,
                Authz::Approval { .. } => 1,
                Authz::Deny { .. } => 2,
            };
            counts[slot] += 1;
        }
        // 0..=100 -> 101 auto (0 included: policies don't check positivity),
        // 101..=5000 approval, the rest forbidden.
        assert_eq!(counts, [101, 4900, 4999]);
    }
}

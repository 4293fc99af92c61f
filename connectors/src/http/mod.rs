//! The generic HTTP connector (DESIGN.md section 7): each tool is a request description in the
//! connector configuration; the downstream idempotency key goes in a header; a lookup URL
//! answers reconciliation; a per-tool table says which answers prove what.
//!
//! # Layout
//! - [`spec`]: the `[[tool]]` description, its safe defaults and its checks.
//! - [`template`]: URL, header and JSON body templates over the command and its arguments.
//! - [`client`]: one exchange per call, no pool, no retries, no redirects; errors by proof.
//! - [`classify`]: what an exchange proves, with bounded evidence.

pub mod classify;
pub mod client;
pub mod spec;
pub mod template;

use std::collections::BTreeMap;
use std::time::Duration;

use airlock_schemas::{DispatchCommand, ReconcileCommand};
use hyper::header::HeaderName;

use classify::ReferenceFrom;
pub use classify::{Observation, Proof};
use client::{Limits, Outgoing};
use spec::{Prepared, ToolSpec};

/// A connector over one HTTP API.
#[derive(Debug)]
pub struct HttpConnector {
    base_url: String,
    tools: BTreeMap<String, Prepared>,
    limits: Limits,
    max_evidence: usize,
}

impl HttpConnector {
    /// Checks every tool description (resolving `{env:NAME}` through `env`).
    pub fn new(
        base_url: &str,
        specs: &[ToolSpec],
        limits: Limits,
        max_evidence: usize,
        env: &impl Fn(&str) -> Option<String>,
    ) -> Result<Self, spec::Error> {
        let base_url = base_url.trim_end_matches('/').to_owned();
        let mut tools = BTreeMap::new();
        for s in specs {
            let prepared = s.prepare(env)?;
            if tools.insert(s.name.clone(), prepared).is_some() {
                return Err(spec::Error {
                    tool: s.name.clone(),
                    field: "name",
                    message: "described twice".to_owned(),
                });
            }
        }
        Ok(HttpConnector {
            base_url,
            tools,
            limits,
            max_evidence,
        })
    }

    pub fn tools(&self) -> impl Iterator<Item = &str> {
        self.tools.keys().map(String::as_str)
    }

    pub fn max_evidence(&self) -> usize {
        self.max_evidence
    }

    /// The request of a dispatch command over its canonical `arguments`; `Err` says why it
    /// cannot be sent (nothing was).
    pub fn request(
        &self,
        cmd: &DispatchCommand,
        arguments: &serde_json::Value,
    ) -> Result<Outgoing, String> {
        let tool = self.tools.get(&cmd.tool).ok_or_else(|| {
            format!(
                "tool {:?} is not described in this connector's configuration",
                cmd.tool
            )
        })?;
        let placeholder = |name: &str| -> Option<String> {
            Some(match name {
                "base_url" => self.base_url.clone(),
                "idempotency_key" => template::percent_encode(&cmd.idempotency_key),
                "operation_key" => template::percent_encode(&cmd.operation_key),
                "tool" => template::percent_encode(&cmd.tool),
                "tenant_id" => template::percent_encode(&cmd.tenant_id),
                _ => return None,
            })
        };
        let url = template::render_string(&tool.url, placeholder).map_err(|e| e.to_string())?;
        let body = match &tool.body {
            Some(t) => template::render_body(t, arguments, cmd).map_err(|e| e.to_string())?,
            None => cmd.arguments_json.clone(),
        };
        let mut headers = render_headers(&tool.headers, placeholder)?;
        if let Some(name) = &tool.idempotency_header {
            headers.push((
                name.clone(),
                spec::header_value(name, &cmd.idempotency_key)?,
            ));
        }
        Ok(Outgoing {
            method: tool.method.clone(),
            url,
            headers,
            body: Some(body),
        })
    }

    /// Sends `request` (built by [`Self::request`] for `tool`) once, within `timeout`, and
    /// classifies the answer.
    pub async fn call(&self, tool: &str, request: &Outgoing, timeout: Duration) -> Observation {
        let Some(spec) = self.tools.get(tool) else {
            return Observation::not_called(
                format!("tool {tool:?} is not described"),
                self.max_evidence,
            );
        };
        let result = client::send(request, timeout, self.limits).await;
        classify::call(
            result,
            &spec.classify,
            reference_from(spec),
            self.max_evidence,
        )
    }

    /// Looks the effect of `cmd` up by its idempotency key, within `timeout`.
    pub async fn reconcile(&self, cmd: &ReconcileCommand, timeout: Duration) -> Observation {
        let unknown = |why: String| Observation {
            proof: Proof::Unknown,
            evidence: classify::bounded(&why, self.max_evidence),
            provider_reference: None,
        };
        let Some(spec) = self.tools.get(&cmd.tool) else {
            return unknown(format!(
                "tool {:?} is not described in this connector's configuration",
                cmd.tool
            ));
        };
        let Some(lookup) = &spec.lookup else {
            return unknown(format!("tool {:?} has no lookup configured", cmd.tool));
        };
        let placeholder = |name: &str| -> Option<String> {
            Some(match name {
                "base_url" => self.base_url.clone(),
                "idempotency_key" => template::percent_encode(&cmd.idempotency_key),
                "operation_key" => template::percent_encode(&cmd.operation_key),
                "tool" => template::percent_encode(&cmd.tool),
                _ => return None,
            })
        };
        let request = template::render_string(&lookup.url, placeholder)
            .map_err(|e| e.to_string())
            .and_then(|url| {
                Ok(Outgoing {
                    method: lookup.method.clone(),
                    url,
                    headers: render_headers(&lookup.headers, placeholder)?,
                    body: None,
                })
            });
        let request = match request {
            Ok(r) => r,
            Err(e) => return unknown(format!("lookup not sent: {e}")),
        };
        let result = client::send(&request, timeout, self.limits).await;
        classify::lookup(result, lookup, reference_from(spec), self.max_evidence)
    }
}

fn reference_from(spec: &Prepared) -> ReferenceFrom<'_> {
    ReferenceFrom {
        pointer: spec.provider_reference_pointer.as_deref(),
        header: spec.provider_reference_header.as_ref(),
    }
}

fn render_headers(
    templates: &[(HeaderName, String)],
    placeholder: impl Fn(&str) -> Option<String>,
) -> Result<Vec<(HeaderName, hyper::header::HeaderValue)>, String> {
    templates
        .iter()
        .map(|(name, t)| {
            let value = template::render_string(t, &placeholder).map_err(|e| e.to_string())?;
            Ok((name.clone(), spec::header_value(name, &value)?))
        })
        .collect()
}

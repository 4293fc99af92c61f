//! What an HTTP exchange proves (DESIGN.md section 7): proof of effect is COMMITTED, proof of
//! no effect (nothing sent, or a definitive refusal) is FAILED, anything else is UNKNOWN.
//!
//! | observed | call | lookup (reconciliation) |
//! | --- | --- | --- |
//! | request never left (DNS, connect refused, deadline before sending) | FAILED | UNKNOWN |
//! | status in `classify.committed` (default: any 2xx) | COMMITTED | COMMITTED (any 2xx) |
//! | status in `classify.failed` (default 400, 401, 403, 404, 409, 422) | FAILED | - |
//! | status in `lookup.absent` (default 404) with the body marker | - | FAILED (proven absent) |
//! | timeout or reset after sending, 408, 429, 5xx, anything else | UNKNOWN | UNKNOWN |
//!
//! Evidence is the status line and the beginning of the body (or the error), bounded, carried
//! as an opaque string: Airlock stores it for audit and never interprets it.

use super::client::{Error, Reply};
use super::spec::{Classify, PreparedLookup};

/// What an exchange proves about the effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proof {
    /// It happened.
    Committed,
    /// It did not happen.
    Failed,
    /// No proof either way.
    Unknown,
}

/// A classified exchange: the proof, its evidence and the downstream's own id of the effect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    pub proof: Proof,
    pub evidence: String,
    pub provider_reference: Option<String>,
}

/// How the evidence of an attempt failed without a call begins.
pub const NOT_CALLED: &str = "not called: ";

impl Observation {
    /// No call was made: proof of no effect.
    pub fn not_called(why: impl std::fmt::Display, max_evidence: usize) -> Observation {
        Observation {
            proof: Proof::Failed,
            evidence: bounded(&format!("{NOT_CALLED}{why}"), max_evidence),
            provider_reference: None,
        }
    }

    /// True for [`Observation::not_called`].
    pub fn was_not_called(&self) -> bool {
        self.proof == Proof::Failed && self.evidence.starts_with(NOT_CALLED)
    }
}

/// Where the provider reference of a committed answer is read.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReferenceFrom<'a> {
    pub pointer: Option<&'a str>,
    pub header: Option<&'a hyper::header::HeaderName>,
}

/// Longest provider reference kept.
pub const MAX_REFERENCE_BYTES: usize = 256;

/// Classifies the result of a call.
pub fn call(
    result: Result<Reply, Error>,
    table: &Classify,
    reference: ReferenceFrom<'_>,
    max_evidence: usize,
) -> Observation {
    let reply = match result {
        Ok(reply) => reply,
        Err(e @ Error::NotExecuted(_)) => return Observation::not_called(e, max_evidence),
        Err(e @ Error::Ambiguous(_)) => {
            return Observation {
                proof: Proof::Unknown,
                evidence: bounded(&e.to_string(), max_evidence),
                provider_reference: None,
            };
        }
    };
    let status = reply.status.as_u16();
    let committed = if table.committed.is_empty() {
        reply.status.is_success()
    } else {
        table.committed.contains(&status)
    };
    let proof = if committed {
        Proof::Committed
    } else if table.failed.contains(&status) {
        Proof::Failed
    } else {
        Proof::Unknown
    };
    observed(proof, &reply, reference, max_evidence)
}

/// Classifies the result of a lookup.
pub fn lookup(
    result: Result<Reply, Error>,
    spec: &PreparedLookup,
    reference: ReferenceFrom<'_>,
    max_evidence: usize,
) -> Observation {
    let reply = match result {
        Ok(reply) => reply,
        // A lookup that failed proves nothing about the effect.
        Err(e) => {
            return Observation {
                proof: Proof::Unknown,
                evidence: bounded(&format!("lookup failed: {e}"), max_evidence),
                provider_reference: None,
            };
        }
    };
    let status = reply.status.as_u16();
    let proof = if reply.status.is_success() {
        Proof::Committed
    } else if spec.absent.contains(&status)
        && (spec.absent_body_contains.is_empty()
            || String::from_utf8_lossy(&reply.body).contains(&spec.absent_body_contains))
    {
        Proof::Failed
    } else {
        Proof::Unknown
    };
    observed(proof, &reply, reference, max_evidence)
}

fn observed(
    proof: Proof,
    reply: &Reply,
    reference: ReferenceFrom<'_>,
    max_evidence: usize,
) -> Observation {
    let provider_reference = if proof == Proof::Committed {
        provider_reference(reply, reference)
    } else {
        None
    };
    let body = String::from_utf8_lossy(&reply.body);
    let evidence = format!(
        "HTTP {}{}: {body}{}",
        reply.status.as_u16(),
        reply
            .status
            .canonical_reason()
            .map(|r| format!(" {r}"))
            .unwrap_or_default(),
        if reply.truncated {
            " [body truncated]"
        } else {
            ""
        }
    );
    Observation {
        proof,
        evidence: bounded(&evidence, max_evidence),
        provider_reference,
    }
}

fn provider_reference(reply: &Reply, from: ReferenceFrom<'_>) -> Option<String> {
    let from_header = from
        .header
        .and_then(|h| reply.headers.get(h))
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let from_body = || {
        let pointer = from.pointer?;
        let value: serde_json::Value = serde_json::from_slice(&reply.body).ok()?;
        match value.pointer(pointer)? {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    };
    from_header
        .or_else(from_body)
        .map(|r| bounded(&r, MAX_REFERENCE_BYTES))
}

/// `text` cut to at most `max` bytes on a character boundary.
pub fn bounded(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use hyper::body::Bytes;
    use hyper::{HeaderMap, StatusCode};

    fn reply(status: u16, body: &str) -> Result<Reply, Error> {
        Ok(Reply {
            status: StatusCode::from_u16(status).unwrap(),
            headers: HeaderMap::new(),
            body: Bytes::from(body.to_owned()),
            truncated: false,
        })
    }

    const REF: ReferenceFrom<'static> = ReferenceFrom {
        pointer: Some("/effect_id"),
        header: None,
    };

    fn proof_of_call(result: Result<Reply, Error>) -> Proof {
        call(result, &Classify::default(), REF, 4096).proof
    }

    #[test]
    fn a_2xx_is_committed_with_the_providers_reference() {
        let o = call(
            reply(201, r#"{"effect_id":"eff_7"}"#),
            &Classify::default(),
            REF,
            4096,
        );
        assert_eq!(o.proof, Proof::Committed);
        assert_eq!(o.provider_reference.as_deref(), Some("eff_7"));
        assert!(
            o.evidence.starts_with("HTTP 201 Created: {"),
            "{}",
            o.evidence
        );
        assert_eq!(proof_of_call(reply(200, "not json")), Proof::Committed);
    }

    #[test]
    fn definitive_refusals_and_unsent_requests_are_failed() {
        for status in [400, 401, 403, 404, 409, 422] {
            assert_eq!(
                proof_of_call(reply(status, "{}")),
                Proof::Failed,
                "{status}"
            );
        }
        let o = call(
            Err(Error::NotExecuted(
                "connecting to 127.0.0.1:1: refused".into(),
            )),
            &Classify::default(),
            REF,
            4096,
        );
        assert_eq!(o.proof, Proof::Failed);
        assert!(o.evidence.starts_with("not called: "), "{}", o.evidence);
    }

    #[test]
    fn timeout_is_unknown_not_failed() {
        assert_eq!(
            proof_of_call(Err(Error::Ambiguous("no complete answer within 5s".into()))),
            Proof::Unknown
        );
        for status in [408, 429, 500, 502, 503, 504, 302, 100, 418] {
            assert_eq!(proof_of_call(reply(status, "")), Proof::Unknown, "{status}");
        }
    }

    #[test]
    fn a_configured_table_replaces_the_defaults() {
        let table = Classify {
            failed: vec![422],
            committed: vec![201],
        };
        assert_eq!(call(reply(200, ""), &table, REF, 64).proof, Proof::Unknown);
        assert_eq!(call(reply(404, ""), &table, REF, 64).proof, Proof::Unknown);
        assert_eq!(call(reply(422, ""), &table, REF, 64).proof, Proof::Failed);
    }

    #[test]
    fn only_a_marked_404_proves_absence() {
        let spec = PreparedLookup {
            method: hyper::Method::GET,
            url: String::new(),
            headers: Vec::new(),
            absent: vec![404],
            absent_body_contains: r#""error":"not_found""#.to_owned(),
        };
        let absent = lookup(
            reply(404, r#"{"detail":"x","error":"not_found"}"#),
            &spec,
            REF,
            4096,
        );
        assert_eq!(absent.proof, Proof::Failed);
        let wrong_route = lookup(reply(404, r#"{"error":"no_route"}"#), &spec, REF, 4096);
        assert_eq!(wrong_route.proof, Proof::Unknown);
        assert_eq!(
            lookup(reply(200, "{}"), &spec, REF, 4096).proof,
            Proof::Committed
        );
        assert_eq!(
            lookup(reply(503, ""), &spec, REF, 4096).proof,
            Proof::Unknown
        );
        let unsent = lookup(Err(Error::NotExecuted("refused".into())), &spec, REF, 4096);
        assert_eq!(unsent.proof, Proof::Unknown);
    }

    #[test]
    fn evidence_is_bounded_on_a_character_boundary() {
        let long = "é".repeat(3000);
        let o = call(reply(500, &long), &Classify::default(), REF, 4096);
        assert!(o.evidence.len() <= 4096);
        assert!(o.evidence.ends_with('é'));
    }
}

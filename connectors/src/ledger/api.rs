//! The ledger's HTTP API: routes, request checks, how outcomes and injected faults become
//! responses. JSON everywhere; every error is `{"error": <code>, "detail": <text>}`.
//!
//! The money routes need a [`ConnectionControl`] in the request extensions (the
//! [`server`](super::server) puts one on every connection) to play `drop-response`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::Deserialize;
use serde_json::json;

use super::faults::{Fault, FaultBook, Rule};
use super::model::{AccountSpec, Kind, Submission, check_id};
use super::server::ConnectionControl;
use super::store::{Created, Outcome, Store};
use airlock_processor::runtime::logging::utc_now;

/// The request header carrying the client's idempotency key (required on money requests).
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Set to `true` on an answer that replays the first answer of an idempotency key.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";
/// The request header arming one fault for this request only: `Ledger-Fault: drop-response`.
pub const LEDGER_FAULT: &str = "ledger-fault";
/// The exit code of an injected `crash-after-commit`.
pub const CRASH_EXIT_CODE: i32 = 70;

/// What every handler shares.
#[derive(Debug)]
pub struct Ledger {
    pub store: Arc<Store>,
    pub faults: Arc<FaultBook>,
    /// Largest accepted request body in bytes.
    pub body_limit: usize,
}

/// The routes over `ledger`.
pub fn router(ledger: Arc<Ledger>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/v1/accounts", post(create_account))
        .route("/v1/accounts/{account_id}", get(account))
        .route("/v1/debits", post(debit))
        .route("/v1/refunds", post(refund))
        .route("/v1/effects/{idempotency_key}", get(effect))
        .route("/v1/stats", get(stats))
        .route(
            "/v1/faults",
            get(list_faults).post(arm_fault).delete(clear_faults),
        )
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no_route", "no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this route does not take that method",
            )
        })
        .layer(middleware::from_fn(log_request))
        .with_state(ledger)
}

/// An error answer: `{"error": code, "detail": detail}` with `status`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    detail: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            detail: detail.into(),
        }
    }

    fn bad_request(code: &'static str, detail: impl ToString) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, code, detail.to_string())
    }

    fn internal(detail: impl ToString) -> ApiError {
        let detail = detail.to_string();
        log::error!("internal error: {detail}");
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", detail)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({ "error": self.code, "detail": self.detail });
        (self.status, Json(body)).into_response()
    }
}

type ApiResult = Result<Response, ApiError>;

async fn log_request(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let line = format!(
        "{} {}{}",
        request.method(),
        request.uri(),
        request
            .headers()
            .get(IDEMPOTENCY_KEY)
            .and_then(|k| k.to_str().ok())
            .map(|k| format!(" key={k}"))
            .unwrap_or_default()
    );
    let response = next.run(request).await;
    log::info!(
        "{line} -> {} ({} ms)",
        response.status().as_u16(),
        started.elapsed().as_millis()
    );
    response
}

/// Runs blocking store work off the async workers.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> super::store::Result<T> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(ApiError::internal)?
        .map_err(ApiError::internal)
}

async fn read_body(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("request bodies are limited to {limit} bytes"),
        )),
        Err(e) => Err(ApiError::bad_request("unreadable_body", e)),
    }
}

/// A JSON body as a stored, replayable answer.
fn json_text(status: StatusCode, text: String) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        text,
    )
        .into_response()
}

async fn healthz() -> Json<serde_json::Value> {
    Json(json!({ "status": "ok" }))
}

async fn create_account(State(ledger): State<Arc<Ledger>>, body: Body) -> ApiResult {
    let body = read_body(body, ledger.body_limit).await?;
    let spec: AccountSpec =
        serde_json::from_slice(&body).map_err(|e| ApiError::bad_request("invalid_request", e))?;
    spec.validate()
        .map_err(|e| ApiError::bad_request("invalid_request", e))?;
    let store = ledger.store.clone();
    let created = blocking(move || store.create_account(&spec, &utc_now())).await?;
    Ok(match created {
        Created::Created(account) => (StatusCode::CREATED, Json(account)).into_response(),
        Created::Existing(account) => (StatusCode::OK, Json(account)).into_response(),
        Created::Conflict(account) => ApiError::new(
            StatusCode::CONFLICT,
            "account_exists",
            format!(
                "account {} exists with another tenant, currency or opening balance",
                account.account_id
            ),
        )
        .into_response(),
    })
}

async fn account(
    State(ledger): State<Arc<Ledger>>,
    account_id: Result<Path<String>, PathRejection>,
) -> ApiResult {
    let Path(account_id) = account_id.map_err(|e| ApiError::bad_request("invalid_path", e))?;
    let store = ledger.store.clone();
    let id = account_id.clone();
    match blocking(move || store.account(&id)).await? {
        Some(account) => Ok(Json(account).into_response()),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_account",
            format!("account {account_id} does not exist"),
        )),
    }
}

async fn debit(
    State(ledger): State<Arc<Ledger>>,
    Extension(control): Extension<ConnectionControl>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    money(ledger, control, Kind::Debit, headers, body).await
}

async fn refund(
    State(ledger): State<Arc<Ledger>>,
    Extension(control): Extension<ConnectionControl>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    money(ledger, control, Kind::Refund, headers, body).await
}

fn idempotency_key(headers: &HeaderMap) -> Result<String, ApiError> {
    let value = headers.get(IDEMPOTENCY_KEY).ok_or_else(|| {
        ApiError::bad_request(
            "missing_idempotency_key",
            "money requests need an Idempotency-Key header",
        )
    })?;
    let key = value
        .to_str()
        .ok()
        .filter(|k| check_id("Idempotency-Key", k).is_ok())
        .ok_or_else(|| {
            ApiError::bad_request(
                "invalid_idempotency_key",
                "Idempotency-Key must be 1 to 255 visible ASCII characters",
            )
        })?;
    Ok(key.to_owned())
}

fn header_fault(headers: &HeaderMap) -> Result<Option<Fault>, ApiError> {
    headers
        .get(LEDGER_FAULT)
        .map(|value| {
            value
                .to_str()
                .map_err(|_| ApiError::bad_request("invalid_fault", "Ledger-Fault is not ASCII"))?
                .parse::<Fault>()
                .map_err(|e| ApiError::bad_request("invalid_fault", e))
        })
        .transpose()
}

/// A debit or a refund: check, commit at most once per idempotency key, play the fault.
async fn money(
    ledger: Arc<Ledger>,
    control: ConnectionControl,
    kind: Kind,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let key = idempotency_key(&headers)?;
    let header_fault = header_fault(&headers)?;
    let body = read_body(body, ledger.body_limit).await?;
    let submission =
        Submission::parse(&body).map_err(|e| ApiError::bad_request("invalid_request", e))?;
    let (store, faults) = (ledger.store.clone(), ledger.faults.clone());
    let outcome = {
        let key = key.clone();
        blocking(move || {
            // A header fault is for this request only and leaves the armed rules alone.
            let fault = || header_fault.or_else(|| faults.take(kind, &submission.request));
            store.submit(kind, &key, &submission, &utc_now(), fault)
        })
        .await?
    };
    match outcome {
        Outcome::Committed {
            effect,
            response,
            fault,
        } => {
            log::info!(
                "committed {} {} {} {} on {} for {} under key {key}",
                effect.effect_id,
                kind.as_str(),
                effect.amount.minor_units,
                effect.amount.currency,
                effect.account_id,
                effect.reference
            );
            after_commit(&key, fault, control, response).await
        }
        Outcome::Replayed { response } => {
            let mut reply = json_text(StatusCode::OK, response);
            reply
                .headers_mut()
                .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
            Ok(reply)
        }
        Outcome::KeyReused => Err(ApiError::new(
            StatusCode::CONFLICT,
            "idempotency_key_reused",
            format!("key {key} was committed with another request"),
        )),
        Outcome::Rejected(rejection) => {
            let status = match rejection.code() {
                "unknown_account" => StatusCode::NOT_FOUND,
                "tenant_mismatch" => StatusCode::FORBIDDEN,
                _ => StatusCode::UNPROCESSABLE_ENTITY,
            };
            Err(ApiError::new(
                status,
                rejection.code(),
                rejection.to_string(),
            ))
        }
        Outcome::Faulted(fault) => {
            log::info!("injected {fault}: key {key} not committed");
            Err(match fault {
                Fault::Refuse => ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "injected_refusal",
                    "refused by an injected fault; nothing was committed",
                ),
                _ => ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "injected_unavailable",
                    "unavailable (injected fault)",
                ),
            })
        }
    }
}

/// Answers a freshly committed effect, misbehaving as the fault says.
async fn after_commit(
    key: &str,
    fault: Option<Fault>,
    control: ConnectionControl,
    response: String,
) -> ApiResult {
    match fault {
        None => {}
        Some(Fault::Delay { ms }) => {
            log::info!("injected delay: answering key {key} in {ms} ms");
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        Some(Fault::DropResponse) => {
            log::info!("injected drop-response: closing the connection of key {key} unanswered");
            control.drop_connection();
            // The connection task drops this future with the connection.
            return std::future::pending().await;
        }
        Some(Fault::ErrorAfterCommit) => {
            log::info!("injected error-after-commit: key {key} is committed, answering 500");
            return Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "injected_error",
                "internal error (injected fault)",
            ));
        }
        Some(Fault::CrashAfterCommit) => {
            log::error!("injected crash-after-commit: key {key} is committed, exiting now");
            std::process::exit(CRASH_EXIT_CODE);
        }
        Some(fault @ (Fault::Refuse | Fault::ErrorBeforeCommit)) => {
            return Err(ApiError::internal(format!(
                "{fault} reached the commit of key {key}"
            )));
        }
    }
    Ok(json_text(StatusCode::CREATED, response))
}

async fn effect(
    State(ledger): State<Arc<Ledger>>,
    key: Result<Path<String>, PathRejection>,
) -> ApiResult {
    let Path(key) = key.map_err(|e| ApiError::bad_request("invalid_path", e))?;
    let store = ledger.store.clone();
    let lookup = key.clone();
    match blocking(move || store.effect(&lookup)).await? {
        Some(effect) => Ok(Json(effect).into_response()),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no effect is committed under key {key}"),
        )),
    }
}

#[derive(Debug, Deserialize)]
struct StatsQuery {
    reference: Option<String>,
}

async fn stats(
    State(ledger): State<Arc<Ledger>>,
    query: Result<Query<StatsQuery>, QueryRejection>,
) -> ApiResult {
    let Query(query) = query.map_err(|e| ApiError::bad_request("invalid_query", e))?;
    let store = ledger.store.clone();
    Ok(match query.reference {
        Some(reference) => {
            Json(blocking(move || store.reference_stats(&reference)).await?).into_response()
        }
        None => Json(blocking(move || store.stats()).await?).into_response(),
    })
}

async fn list_faults(State(ledger): State<Arc<Ledger>>) -> Response {
    Json(json!({ "faults": ledger.faults.list() })).into_response()
}

async fn arm_fault(State(ledger): State<Arc<Ledger>>, body: Body) -> ApiResult {
    let body = read_body(body, ledger.body_limit).await?;
    let rule: Rule =
        serde_json::from_slice(&body).map_err(|e| ApiError::bad_request("invalid_fault", e))?;
    let armed = ledger.faults.arm(rule);
    log::info!("armed fault rule {}: {}", armed.id, armed.fault);
    Ok((StatusCode::CREATED, Json(armed)).into_response())
}

async fn clear_faults(State(ledger): State<Arc<Ledger>>) -> Response {
    let cleared = ledger.faults.clear();
    Json(json!({ "cleared": cleared })).into_response()
}

//! `meta/v1 Status` failures, shaped like the apiserver's `StatusError`s.

use serde_json::{json, Map, Value};

use crate::kinds::KindInfo;

/// A failed request: an HTTP code and the `Status` body the apiserver sends with it.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
    /// `Retry-After` header and `details.retryAfterSeconds`.
    pub retry_after: Option<u32>,
    /// The PodDisruptionBudget that refused an eviction (for the eviction log; not sent).
    pub blocking_pdb: Option<String>,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
            retry_after: None,
            blocking_pdb: None,
        }
    }

    fn with_details(mut self, kind: &KindInfo, name: &str) -> Self {
        let mut d = Map::new();
        if !name.is_empty() {
            d.insert("name".into(), json!(name));
        }
        if !kind.group.is_empty() {
            d.insert("group".into(), json!(kind.group));
        }
        d.insert("kind".into(), json!(kind.plural));
        self.details = Some(Value::Object(d));
        self
    }

    pub fn not_found(kind: &KindInfo, name: &str) -> Self {
        ApiError::new(
            404,
            "NotFound",
            format!("{} \"{}\" not found", kind.qualified(), name),
        )
        .with_details(kind, name)
    }

    pub fn already_exists(kind: &KindInfo, name: &str) -> Self {
        ApiError::new(
            409,
            "AlreadyExists",
            format!("{} \"{}\" already exists", kind.qualified(), name),
        )
        .with_details(kind, name)
    }

    /// `Operation cannot be fulfilled on <resource> "<name>": <why>`.
    pub fn conflict(kind: &KindInfo, name: &str, why: &str) -> Self {
        ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{}\": {}",
                kind.qualified(),
                name,
                why
            ),
        )
        .with_details(kind, name)
    }

    pub fn stale(kind: &KindInfo, name: &str) -> Self {
        ApiError::conflict(
            kind,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(400, "BadRequest", message)
    }

    /// 422 `<Kind>[.<group>] "<name>" is invalid: <field>: <what>`: the apiserver names the
    /// kind with its group outside the core group (apimachinery `errors.NewInvalid` with the
    /// GroupKind), e.g. `ResourceSlice.resource.k8s.io "n-0" is invalid: spec: ...`.
    pub fn invalid(kind: &KindInfo, name: &str, field: &str, what: &str) -> Self {
        let group_kind = if kind.group.is_empty() {
            kind.kind.to_string()
        } else {
            format!("{}.{}", kind.kind, kind.group)
        };
        let mut e = ApiError::new(
            422,
            "Invalid",
            format!("{group_kind} \"{name}\" is invalid: {field}: {what}"),
        )
        .with_details(kind, name);
        if let Some(Value::Object(d)) = e.details.as_mut() {
            d.insert("kind".into(), json!(kind.kind));
            d.insert(
                "causes".into(),
                json!([{"reason": "FieldValueInvalid", "message": what, "field": field}]),
            );
        }
        e
    }

    pub fn unprocessable(message: impl Into<String>) -> Self {
        ApiError::new(422, "Invalid", message)
    }

    pub fn method_not_allowed() -> Self {
        ApiError::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format ({content_type}) - accepted \
                 media types include: application/json-patch+json, application/merge-patch+json, \
                 application/strategic-merge-patch+json"
            ),
        )
    }

    pub fn path_not_found() -> Self {
        ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    /// 410 Expired, as a watch or a continued list from a compacted resourceVersion gets.
    pub fn expired(message: impl Into<String>) -> Self {
        ApiError::new(410, "Expired", message)
    }

    pub fn too_large_resource_version() -> Self {
        let mut e = ApiError::new(
            504,
            "Timeout",
            "Too large resource version: the requested resourceVersion is newer than the server's",
        );
        e.details = Some(
            json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1}),
        );
        e.retry_after = Some(1);
        e
    }

    pub fn too_many_requests(message: impl Into<String>, retry_after: u32) -> Self {
        let mut e = ApiError::new(429, "TooManyRequests", message);
        if retry_after > 0 {
            e.retry_after = Some(retry_after);
            e.details = Some(json!({ "retryAfterSeconds": retry_after }));
        }
        e
    }

    pub fn add_cause(&mut self, reason: &str, message: &str) {
        let d = self.details.get_or_insert_with(|| json!({}));
        if let Value::Object(m) = d {
            let causes = m.entry("causes").or_insert_with(|| json!([]));
            if let Value::Array(a) = causes {
                a.push(json!({"reason": reason, "message": message}));
            }
        }
    }

    /// The error an injected fault answers with.
    pub fn injected(code: u16) -> Self {
        let (reason, message): (&'static str, &str) = match code {
            400 => ("BadRequest", "injected fault: bad request"),
            401 => ("Unauthorized", "Unauthorized"),
            403 => ("Forbidden", "injected fault: forbidden"),
            404 => ("NotFound", "injected fault: not found"),
            409 => ("Conflict", "injected fault: conflict"),
            410 => ("Expired", "injected fault: expired"),
            429 => (
                "TooManyRequests",
                "injected fault: too many requests, please try again later",
            ),
            500 => ("InternalError", "Internal error occurred: injected fault"),
            503 => (
                "ServiceUnavailable",
                "injected fault: the server is currently unable to handle the request",
            ),
            504 => (
                "Timeout",
                "injected fault: the server was unable to return a response in the time allotted",
            ),
            _ => ("", "injected fault"),
        };
        let mut e = ApiError::new(code, reason, message);
        // Like the apiserver's max-in-flight / priority-and-fairness rejections.
        if code == 429 {
            e.retry_after = Some(1);
            e.details = Some(json!({ "retryAfterSeconds": 1 }));
        }
        e
    }

    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "code": self.code,
        });
        if !self.reason.is_empty() {
            s["reason"] = json!(self.reason);
        }
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

/// A `Status` with `status: Success`.
pub(crate) fn success_status(code: u16) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "code": code,
    })
}

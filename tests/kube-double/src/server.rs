//! The HTTP side: URL routing to resources and verbs, the request log, injected faults,
//! discovery documents and the streaming watch responses.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{to_bytes, Body, Bytes};
use axum::extract::{Request, State as AxumState};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};

use crate::kinds::{lookup, KindId, KINDS, PODS};
use crate::status::ApiError;
use crate::store::{ListQuery, WatchStart};
use crate::{Fault, RequestRecord, Shared, Verb};

/// How long a list or watch for a resourceVersion newer than the store waits before 504.
const TOO_NEW_WAIT: Duration = Duration::from_secs(3);
/// The watch timeout when the client sets none (the apiserver's minRequestTimeout).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

pub(crate) fn router(shared: Arc<Shared>) -> axum::Router {
    axum::Router::new().fallback(handle).with_state(shared)
}

/// A request routed to a resource.
#[derive(Debug, Clone)]
struct Target {
    kind: KindId,
    namespace: Option<String>,
    name: Option<String>,
    sub: Option<String>,
    /// The legacy `/watch/` path prefix was used.
    watch_path: bool,
}

enum Route {
    Resource(Target),
    Version,
    Health,
    CoreVersions,
    Groups,
    ResourceList(&'static str, &'static str),
    NotFound,
}

fn route(path: &str) -> Route {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (group, version, rest): (&str, &str, &[&str]) = match segs.as_slice() {
        ["version"] => return Route::Version,
        ["healthz" | "readyz" | "livez", ..] => return Route::Health,
        ["api"] => return Route::CoreVersions,
        ["apis"] => return Route::Groups,
        ["api", v, rest @ ..] => ("", v, rest),
        ["apis", g, v, rest @ ..] => (g, v, rest),
        _ => return Route::NotFound,
    };
    if rest.is_empty() {
        return KINDS
            .iter()
            .find(|k| k.group == group && k.version == version)
            .map(|k| Route::ResourceList(k.group, k.version))
            .unwrap_or(Route::NotFound);
    }
    let (watch_path, rest) = match rest {
        ["watch", r @ ..] => (true, r),
        r => (false, r),
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, r @ ..] if !r.is_empty() => (Some(ns.to_string()), r),
        r => (None, r),
    };
    let (plural, name, sub) = match rest {
        [p] => (*p, None, None),
        [p, n] => (*p, Some(n.to_string()), None),
        [p, n, s] => (*p, Some(n.to_string()), Some(s.to_string())),
        _ => return Route::NotFound,
    };
    let Some(kind) = lookup(group, version, plural) else {
        return Route::NotFound;
    };
    let k = &KINDS[kind];
    // A namespaced resource is addressed by name only inside its namespace, a cluster-scoped one
    // never inside one.
    if (namespace.is_some() && !k.namespaced)
        || (name.is_some() && k.namespaced && namespace.is_none())
    {
        return Route::NotFound;
    }
    match sub.as_deref() {
        None => {}
        Some("status") if k.status_subresource => {}
        Some("eviction") if kind == PODS => {}
        Some(_) => return Route::NotFound,
    }
    Route::Resource(Target {
        kind,
        namespace,
        name,
        sub,
        watch_path,
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match u8::from_str_radix(&s[i + 1..i + 3], 16) {
                Ok(b) => {
                    out.push(b);
                    i += 2;
                }
                Err(_) => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The field manager a write is recorded under, as kube-apiserver names it
/// (k8s.io/apiserver/pkg/endpoints/handlers/rest.go, `managerOrUserAgent`): the request's
/// `fieldManager`, else the User-Agent up to its first `/` (Kubernetes documentation,
/// "Server-Side Apply", field management: the manager of a request without one is taken from
/// its user agent); empty when both are missing.
fn field_manager(query: Option<&str>, user_agent: &str) -> String {
    match query {
        Some(m) if !m.is_empty() => m.to_string(),
        _ => user_agent.split('/').next().unwrap_or("").to_string(),
    }
}

fn parse_query(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn query_get<'a>(q: &'a [(String, String)], key: &str) -> Option<&'a str> {
    q.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

fn truthy(v: Option<&str>) -> bool {
    matches!(v, Some("true" | "1"))
}

fn list_query(q: &[(String, String)]) -> ListQuery {
    ListQuery {
        label_selector: query_get(q, "labelSelector").map(str::to_string),
        field_selector: query_get(q, "fieldSelector").map(str::to_string),
        resource_version: query_get(q, "resourceVersion").map(str::to_string),
        resource_version_match: query_get(q, "resourceVersionMatch").map(str::to_string),
        limit: query_get(q, "limit").and_then(|l| l.parse().ok()),
        continue_token: query_get(q, "continue")
            .filter(|c| !c.is_empty())
            .map(str::to_string),
        allow_bookmarks: truthy(query_get(q, "allowWatchBookmarks")),
        send_initial_events: query_get(q, "sendInitialEvents").map(|v| v == "true" || v == "1"),
    }
}

fn json_response(code: u16, body: &Value) -> Response {
    let mut r = Response::new(Body::from(serde_json::to_vec(body).expect("json")));
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn error_response(e: &ApiError) -> Response {
    let mut r = json_response(e.code, &e.to_status());
    if let Some(s) = e.retry_after {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    r
}

fn text_response(s: &'static str) -> Response {
    let mut r = Response::new(Body::from(s));
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    r
}

fn verb_for(method: &Method, t: &Target, q: &[(String, String)]) -> Option<Verb> {
    let watch = t.watch_path || truthy(query_get(q, "watch"));
    Some(match (method.as_str(), &t.name, t.sub.as_deref()) {
        ("GET", None, None) if watch => Verb::Watch,
        ("GET", None, None) => Verb::List,
        ("GET", Some(_), None) if t.watch_path => Verb::Watch,
        ("GET", Some(_), Some("eviction")) => return None,
        ("GET", Some(_), _) => Verb::Get,
        ("POST", None, None) => Verb::Create,
        ("POST", Some(_), Some("eviction")) => Verb::Create,
        ("PUT", Some(_), s) if s != Some("eviction") => Verb::Update,
        ("PATCH", Some(_), s) if s != Some("eviction") => Verb::Patch,
        ("DELETE", Some(_), None) => Verb::Delete,
        ("DELETE", None, None) => Verb::DeleteCollection,
        _ => return None,
    })
}

async fn handle(AxumState(shared): AxumState<Arc<Shared>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    let raw_query = parts.uri.query().unwrap_or("").to_string();
    let q = parse_query(&raw_query);
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let user_agent = parts
        .headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let field_manager = field_manager(query_get(&q, "fieldManager"), user_agent);
    let body = match to_bytes(body, 64 * 1024 * 1024).await {
        Ok(b) => b,
        Err(e) => return error_response(&ApiError::bad_request(format!("reading body: {e}"))),
    };

    let target = match route(&path) {
        Route::Resource(t) => t,
        other => {
            let r = match other {
                Route::Version => json_response(
                    200,
                    &json!({
                        "major": "1", "minor": "33", "gitVersion": "v1.33.0-kube-double",
                        "gitCommit": "", "gitTreeState": "clean", "buildDate": "",
                        "goVersion": "", "compiler": "", "platform": "linux/amd64",
                    }),
                ),
                Route::Health => text_response("ok"),
                Route::CoreVersions => json_response(
                    200,
                    &json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}),
                ),
                Route::Groups => json_response(200, &group_list()),
                Route::ResourceList(g, v) => json_response(200, &resource_list(g, v)),
                _ => error_response(&ApiError::path_not_found()),
            };
            shared.with(|st| {
                st.requests.push(RequestRecord {
                    method: parts.method.to_string(),
                    path: path.clone(),
                    query: raw_query.clone(),
                    verb: Verb::Get,
                    resource: String::new(),
                    group: String::new(),
                    namespace: None,
                    name: None,
                    content_type: content_type.clone(),
                    field_manager: field_manager.clone(),
                    code: Some(r.status().as_u16()),
                    injected: false,
                })
            });
            return r;
        }
    };
    let kind = &KINDS[target.kind];
    let resource = match &target.sub {
        Some(s) => format!("{}/{}", kind.plural, s),
        None => kind.plural.to_string(),
    };
    let qualified = match &target.sub {
        Some(s) => format!("{}/{}", kind.qualified(), s),
        None => kind.qualified(),
    };
    let verb = verb_for(&parts.method, &target, &q);
    let (idx, fault) = shared.with(|st| {
        st.requests.push(RequestRecord {
            method: parts.method.to_string(),
            path: path.clone(),
            query: raw_query.clone(),
            verb: verb.unwrap_or(Verb::Any),
            resource: resource.clone(),
            group: kind.group.to_string(),
            namespace: target.namespace.clone(),
            name: target.name.clone(),
            content_type: content_type.clone(),
            field_manager: field_manager.clone(),
            code: None,
            injected: false,
        });
        let idx = st.requests.len() - 1;
        let fault = verb.and_then(|v| st.take_fault(v, &resource, &qualified));
        if fault.is_some() {
            st.requests[idx].injected = true;
        }
        (idx, fault)
    });
    let set_code = |code: u16| {
        shared.with(|st| {
            if let Some(r) = st.requests.get_mut(idx) {
                r.code = Some(code);
            }
        })
    };
    let Some(verb) = verb else {
        set_code(405);
        return error_response(&ApiError::method_not_allowed());
    };
    match fault {
        Some(Fault::Status(code)) => {
            let e = ApiError::injected(code);
            if verb == Verb::Create && target.sub.as_deref() == Some("eviction") {
                let (ns, name) = (
                    target.namespace.clone().unwrap_or_default(),
                    target.name.clone().unwrap_or_default(),
                );
                shared.with(|st| st.record_injected_eviction(&ns, &name, code));
            }
            set_code(code);
            return error_response(&e);
        }
        Some(Fault::Hang) => {
            // Never answer; the connection stays open until the client gives up or the double
            // stops.
            std::future::pending::<()>().await;
        }
        Some(Fault::Delay(d)) => tokio::time::sleep(d).await,
        None => {}
    }
    if query_get(&q, "dryRun").is_some_and(|v| !v.is_empty()) {
        let e = ApiError::bad_request("dryRun is not supported by kube-double");
        set_code(e.code);
        return error_response(&e);
    }

    let response = dispatch(&shared, verb, &target, &q, content_type.as_deref(), &body).await;
    set_code(response.status().as_u16());
    response
}

fn parse_body(body: &Bytes) -> Result<Value, ApiError> {
    if body.is_empty() {
        return Ok(json!({}));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding request body: {e}")))
}

async fn wait_until_fresh(shared: &Arc<Shared>, q: &ListQuery) -> Result<(), ApiError> {
    let deadline = tokio::time::Instant::now() + TOO_NEW_WAIT;
    while shared.with(|st| st.too_new(q)).is_some() {
        if tokio::time::Instant::now() >= deadline {
            return Err(ApiError::too_large_resource_version());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

async fn dispatch(
    shared: &Arc<Shared>,
    verb: Verb,
    t: &Target,
    q: &[(String, String)],
    content_type: Option<&str>,
    body: &Bytes,
) -> Response {
    let ns = t.namespace.clone().unwrap_or_default();
    let name = t.name.clone().unwrap_or_default();
    let sub = t.sub.as_deref();
    let result: Result<(u16, Value), ApiError> = match verb {
        Verb::Get => shared.with(|st| st.get(t.kind, &ns, &name).map(|o| (200, o))),
        Verb::List => {
            let lq = list_query(q);
            match wait_until_fresh(shared, &lq).await {
                Ok(()) => shared.with(|st| {
                    st.list(t.kind, t.namespace.as_deref(), &lq)
                        .map(|l| (200, l))
                }),
                Err(e) => Err(e),
            }
        }
        Verb::Watch => return watch(shared, t, q).await,
        Verb::Create if sub == Some("eviction") => match parse_body(body) {
            Ok(b) => shared.with(|st| {
                let r = st.evict(&ns, &name, &b);
                st.record_eviction(&ns, &name, &r);
                r
            }),
            Err(e) => Err(e),
        },
        Verb::Create => match parse_body(body) {
            Ok(b) => shared.with(|st| st.create(t.kind, &ns, b).map(|o| (201, o))),
            Err(e) => Err(e),
        },
        Verb::Update => match parse_body(body) {
            Ok(b) => shared.with(|st| st.update(t.kind, &ns, &name, b, sub)),
            Err(e) => Err(e),
        },
        Verb::Patch => {
            let ct = content_type.unwrap_or("");
            shared.with(|st| st.patch(t.kind, &ns, &name, ct, body, sub))
        }
        Verb::Delete => match parse_body(body) {
            Ok(opts) => {
                let mut opts = opts;
                if let Some(g) =
                    query_get(q, "gracePeriodSeconds").and_then(|g| g.parse::<i64>().ok())
                {
                    opts["gracePeriodSeconds"] = json!(g);
                }
                shared.with(|st| st.delete(t.kind, &ns, &name, &opts).map(|o| (200, o)))
            }
            Err(e) => Err(e),
        },
        Verb::DeleteCollection => match parse_body(body) {
            Ok(opts) => {
                let lq = list_query(q);
                shared.with(|st| {
                    let list = st.list(t.kind, t.namespace.as_deref(), &lq)?;
                    let mut deleted = Vec::new();
                    for item in list["items"].as_array().cloned().unwrap_or_default() {
                        let n = item
                            .pointer("/metadata/name")
                            .and_then(Value::as_str)
                            .unwrap_or("");
                        let item_ns = item
                            .pointer("/metadata/namespace")
                            .and_then(Value::as_str)
                            .unwrap_or("");
                        if let Ok(o) = st.delete(t.kind, item_ns, n, &opts) {
                            deleted.push(o);
                        }
                    }
                    let mut list = list;
                    list["items"] = json!(deleted);
                    Ok((200, list))
                })
            }
            Err(e) => Err(e),
        },
        Verb::Any => Err(ApiError::method_not_allowed()),
    };
    match result {
        Ok((code, out)) => {
            let mut r = json_response(code, &out);
            if verb == Verb::Create && sub == Some("eviction") {
                if let Some(w) = unknown_field_warning(body, "delete_options") {
                    r.headers_mut().insert("Warning", w);
                }
            }
            r
        }
        Err(e) => {
            let mut r = error_response(&e);
            if verb == Verb::Create && sub == Some("eviction") {
                if let Some(w) = unknown_field_warning(body, "delete_options") {
                    r.headers_mut().insert("Warning", w);
                }
            }
            r
        }
    }
}

/// The `Warning` header the apiserver's default field validation (`Warn`) adds for an unknown
/// top-level field, e.g. the `delete_options` key kube-rs puts in its Eviction bodies.
fn unknown_field_warning(body: &Bytes, field: &str) -> Option<HeaderValue> {
    let v: Value = serde_json::from_slice(body).ok()?;
    v.get(field)?;
    HeaderValue::from_str(&format!("299 - \"unknown field \\\"{field}\\\"\"")).ok()
}

async fn watch(shared: &Arc<Shared>, t: &Target, q: &[(String, String)]) -> Response {
    let lq = list_query(q);
    if let Err(e) = wait_until_fresh(shared, &lq).await {
        return error_response(&e);
    }
    let timeout = query_get(q, "timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|&s| s > 0)
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_WATCH_TIMEOUT);
    let started = shared.with(|st| {
        st.watch(
            t.kind,
            t.namespace.as_deref(),
            if t.watch_path {
                t.name.as_deref()
            } else {
                None
            },
            &lq,
        )
        .map(|w| (w, st.bookmark_interval))
    });
    let (start, bookmark_every) = match started {
        Ok(s) => s,
        Err(e) => return error_response(&e),
    };
    let body = match start {
        WatchStart::Expired(line) => Body::from(line),
        WatchStart::Stream { id, rx } => {
            let st = WatchStream {
                guard: WatchGuard {
                    shared: shared.clone(),
                    id,
                },
                rx,
                deadline: tokio::time::Instant::now() + timeout,
                bookmarks: lq.allow_bookmarks,
                tick: tokio::time::interval_at(
                    tokio::time::Instant::now() + bookmark_every,
                    bookmark_every,
                ),
            };
            let stream = futures::stream::unfold(st, |mut st| async move {
                loop {
                    tokio::select! {
                        msg = st.rx.recv() => {
                            return msg.map(|line| (Ok::<_, Infallible>(Bytes::from(line)), st));
                        }
                        _ = tokio::time::sleep_until(st.deadline) => return None,
                        _ = st.tick.tick(), if st.bookmarks => {
                            let id = st.guard.id;
                            st.guard.shared.with(|s| s.bookmark(id));
                        }
                    }
                }
            });
            Body::from_stream(stream)
        }
    };
    let mut r = Response::new(body);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

struct WatchStream {
    guard: WatchGuard,
    rx: tokio::sync::mpsc::UnboundedReceiver<String>,
    deadline: tokio::time::Instant,
    bookmarks: bool,
    tick: tokio::time::Interval,
}

/// Unregisters a watch when its response stream ends or the client goes away.
struct WatchGuard {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        let id = self.id;
        self.shared.with(|st| st.remove_watcher(id));
    }
}

fn group_list() -> Value {
    let mut groups: Vec<(&str, &str)> = KINDS
        .iter()
        .filter(|k| !k.group.is_empty())
        .map(|k| (k.group, k.version))
        .collect();
    groups.dedup();
    let groups: Vec<Value> = groups
        .into_iter()
        .map(|(g, v)| {
            let gv = json!({"groupVersion": format!("{g}/{v}"), "version": v});
            json!({"name": g, "versions": [gv.clone()], "preferredVersion": gv})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

fn resource_list(group: &str, version: &str) -> Value {
    let mut resources = Vec::new();
    for (id, k) in KINDS.iter().enumerate() {
        if k.group != group || k.version != version {
            continue;
        }
        resources.push(json!({
            "name": k.plural,
            "singularName": k.kind.to_ascii_lowercase(),
            "namespaced": k.namespaced,
            "kind": k.kind,
            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
        }));
        if k.status_subresource {
            resources.push(json!({
                "name": format!("{}/status", k.plural),
                "singularName": "",
                "namespaced": k.namespaced,
                "kind": k.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
        if id == PODS {
            resources.push(json!({
                "name": "pods/eviction",
                "singularName": "",
                "namespaced": true,
                "group": "policy",
                "version": "v1",
                "kind": "Eviction",
                "verbs": ["create"],
            }));
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources})
}

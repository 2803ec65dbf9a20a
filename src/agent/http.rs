//! The agent's HTTP endpoint: `/healthz` (liveness), `/readyz` (readiness, with the reason when
//! not ready) and `/metrics` (OpenMetrics text).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;

use super::metrics::Metrics;

/// The `Content-Type` of `/metrics`.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Liveness and readiness, shared between the agent and the HTTP endpoint. Starts not live and
/// not ready ("starting").
#[derive(Clone, Debug)]
pub struct Health {
    inner: Arc<HealthInner>,
}

#[derive(Debug)]
struct HealthInner {
    live: AtomicBool,
    ready: Mutex<(bool, String)>,
}

impl Default for Health {
    fn default() -> Self {
        Self::new()
    }
}

impl Health {
    pub fn new() -> Self {
        Health {
            inner: Arc::new(HealthInner {
                live: AtomicBool::new(false),
                ready: Mutex::new((false, "starting".to_string())),
            }),
        }
    }

    /// `/healthz` answers 200 from now on.
    pub fn set_live(&self) {
        self.inner.live.store(true, Ordering::Relaxed);
    }

    pub fn is_live(&self) -> bool {
        self.inner.live.load(Ordering::Relaxed)
    }

    /// Sets readiness; `reason` is shown in the `/readyz` body when not ready (and logged on a
    /// change).
    pub fn set_ready(&self, ready: bool, reason: String) {
        let mut r = self.inner.ready.lock().unwrap_or_else(|e| e.into_inner());
        if r.0 != ready || r.1 != reason {
            tracing::info!(ready, reason = %reason, "readiness changed");
        }
        *r = (ready, reason);
    }

    /// `(ready, reason)`.
    pub fn readiness(&self) -> (bool, String) {
        self.inner
            .ready
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[derive(Clone)]
struct AppState {
    metrics: Metrics,
    health: Health,
}

/// The routes, for embedding or testing without a socket.
pub fn router(metrics: Metrics, health: Health) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(AppState { metrics, health })
}

async fn healthz(State(s): State<AppState>) -> Response {
    if s.health.is_live() {
        (StatusCode::OK, "ok").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting").into_response()
    }
}

async fn readyz(State(s): State<AppState>) -> Response {
    match s.health.readiness() {
        (true, _) => (StatusCode::OK, "ready").into_response(),
        (false, reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {reason}"),
        )
            .into_response(),
    }
}

async fn metrics_text(State(s): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)],
        s.metrics.encode(),
    )
        .into_response()
}

/// Binds `addr` (port 0 picks a free port) and returns the listener with its actual address.
pub async fn bind(addr: SocketAddr) -> std::io::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    Ok((listener, local))
}

/// Serves the endpoint on `listener` until an I/O error ends it.
pub async fn serve(listener: TcpListener, metrics: Metrics, health: Health) -> std::io::Result<()> {
    axum::serve(listener, router(metrics, health)).await
}

/// [`serve`] until `shutdown` completes; in-flight requests are finished first.
pub async fn serve_with_shutdown(
    listener: TcpListener,
    metrics: Metrics,
    health: Health,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(metrics, health))
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    struct Reply {
        status: u16,
        headers: Vec<(String, String)>,
        body: String,
    }

    impl Reply {
        fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
        }
    }

    /// A minimal HTTP/1.1 GET (`Connection: close`, so the body runs to EOF). Blocking std I/O
    /// on the blocking pool: the crate's tokio has no `io-util`.
    async fn get(addr: SocketAddr, path: &str) -> Reply {
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        let raw = tokio::task::spawn_blocking(move || {
            use std::io::{Read, Write};
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s.write_all(request.as_bytes()).unwrap();
            let mut raw = Vec::new();
            s.read_to_end(&mut raw).expect("response within 5 s");
            raw
        })
        .await
        .unwrap();
        let raw = String::from_utf8(raw).unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").expect("header end");
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .unwrap()
            .split(' ')
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        let chunked = headers.iter().any(|(k, v)| {
            k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
        });
        let body = if chunked {
            dechunk(body)
        } else {
            body.to_string()
        };
        Reply {
            status,
            headers,
            body,
        }
    }

    fn dechunk(mut rest: &str) -> String {
        let mut out = String::new();
        loop {
            let (size, after) = rest.split_once("\r\n").expect("chunk size");
            let size = usize::from_str_radix(size.trim(), 16).expect("hex chunk size");
            if size == 0 {
                return out;
            }
            out.push_str(&after[..size]);
            rest = &after[size + 2..];
        }
    }

    async fn start() -> (
        SocketAddr,
        Metrics,
        Health,
        tokio::sync::oneshot::Sender<()>,
    ) {
        let metrics = Metrics::new();
        let health = Health::new();
        let (listener, addr) = bind(SocketAddr::from(([127, 0, 0, 1], 0))).await.unwrap();
        assert_ne!(addr.port(), 0);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve_with_shutdown(
            listener,
            metrics.clone(),
            health.clone(),
            async move {
                let _ = rx.await;
            },
        ));
        (addr, metrics, health, tx)
    }

    #[tokio::test]
    async fn healthz_and_readyz_follow_health() {
        let (addr, _metrics, health, _stop) = start().await;

        let r = get(addr, "/healthz").await;
        assert_eq!((r.status, r.body.as_str()), (503, "starting"));
        let r = get(addr, "/readyz").await;
        assert_eq!((r.status, r.body.as_str()), (503, "not ready: starting"));

        health.set_live();
        let r = get(addr, "/healthz").await;
        assert_eq!((r.status, r.body.as_str()), (200, "ok"));

        health.set_ready(false, "watchers not synced".into());
        let r = get(addr, "/readyz").await;
        assert_eq!(
            (r.status, r.body.as_str()),
            (503, "not ready: watchers not synced")
        );

        health.set_ready(true, "watchers synced".into());
        let r = get(addr, "/readyz").await;
        assert_eq!((r.status, r.body.as_str()), (200, "ready"));

        health.set_ready(
            false,
            "GPU stack check failed: NVML: library not found".into(),
        );
        let r = get(addr, "/readyz").await;
        assert_eq!(r.status, 503);
        assert!(r.body.contains("NVML: library not found"), "{}", r.body);
        // Liveness does not depend on readiness.
        assert_eq!(get(addr, "/healthz").await.status, 200);
    }

    #[tokio::test]
    async fn metrics_are_openmetrics_text() {
        let (addr, metrics, _health, _stop) = start().await;
        metrics.reconciled("success", Duration::from_millis(30));
        metrics.set_profile(Some(("small", "abc")));
        metrics.set_state("success");
        let r = get(addr, "/metrics").await;
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-type"), Some(OPENMETRICS_CONTENT_TYPE));
        assert!(r.body.ends_with("# EOF\n"), "{}", r.body);
        assert!(
            r.body
                .contains("gpu_share_reconciles_total{result=\"success\"} 1\n"),
            "{}",
            r.body
        );
        assert!(
            r.body
                .contains("gpu_share_profile_info{profile=\"small\",hash=\"abc\"} 1\n"),
            "{}",
            r.body
        );
        assert!(
            r.body.contains("gpu_share_state{state=\"success\"} 1\n"),
            "{}",
            r.body
        );
    }

    #[tokio::test]
    async fn unknown_paths_are_404_and_shutdown_stops_serving() {
        let (addr, _metrics, _health, stop) = start().await;
        assert_eq!(get(addr, "/nope").await.status, 404);
        stop.send(()).unwrap();
        // The listener closes once the server has shut down.
        let mut refused = false;
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(addr).await.is_err() {
                refused = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(refused, "still accepting after shutdown");
    }
}

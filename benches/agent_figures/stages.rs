//! Where the time of a label change goes, stage by stage.
//!
//! The harness opens its own raw Node watch (kube's plain `Api::watch`, no watcher or cache in
//! between) on the API double and timestamps every event of the bench node as it arrives. Per
//! label change it then knows, on the one wall clock this machine has:
//!
//! - the label write at the API double (the harness's own call),
//! - the watch event's arrival (the harness's watch, the agent's gets the same fan-out),
//! - the reconcile's start (the agent's `reconciling` log line, microsecond timestamps),
//! - the device-plugin config written (the harness sees the file's bytes change, polling
//!   every 0.1 ms, finer than the 0.5 ms),
//! - `success` published (the harness's watch sees state `success` with the new hash).

use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, WatchEvent, WatchParams};
use kube_double::KubeDouble;
use node_sim::{APPLIED_HASH, PROFILE_LABEL, STATE_LABEL};

/// One Node event, as the harness's watch received it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub at: SystemTime,
    pub profile: Option<String>,
    pub state: Option<String>,
    pub hash: Option<String>,
}

/// The harness's raw watch on one Node; its thread ends with the process.
pub struct NodeEvents {
    rx: mpsc::Receiver<Seen>,
    /// Received but not yet asked for.
    backlog: Vec<Seen>,
}

impl NodeEvents {
    /// Watch `node` from its current resourceVersion on (only changes made after this call).
    pub fn start(api: &KubeDouble, node: &str) -> NodeEvents {
        let client_config = api.client_config();
        let rv = api
            .node(node)
            .and_then(|n| n.metadata.resource_version)
            .expect("the node exists");
        let (tx, rx) = mpsc::channel();
        let name = node.to_string();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            runtime.block_on(watch(client_config, name, rv, tx));
        });
        NodeEvents {
            rx,
            backlog: Vec::new(),
        }
    }

    /// The first event (received or still to come, within `timeout`) that `want` accepts;
    /// events before it are dropped.
    pub fn first(&mut self, timeout: Duration, want: impl Fn(&Seen) -> bool) -> Option<Seen> {
        if let Some(i) = self.backlog.iter().position(&want) {
            let seen = self.backlog[i].clone();
            self.backlog.drain(..=i);
            return Some(seen);
        }
        self.backlog.clear();
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let seen = self.rx.recv_timeout(left).ok()?;
            if want(&seen) {
                return Some(seen);
            }
        }
    }

    /// Move what has arrived so far into the backlog (so later `first` calls see it).
    pub fn collect(&mut self) {
        self.backlog.extend(self.rx.try_iter());
    }
}

async fn watch(config: kube::Config, name: String, mut rv: String, tx: mpsc::Sender<Seen>) {
    let client = kube::Client::try_from(config).expect("client");
    let nodes: Api<Node> = Api::all(client);
    let params = WatchParams::default().fields(&format!("metadata.name={name}"));
    loop {
        let Ok(stream) = nodes.watch(&params, &rv).await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let mut stream = stream.boxed();
        while let Some(event) = stream.next().await {
            let at = SystemTime::now();
            let node = match event {
                Ok(WatchEvent::Added(n) | WatchEvent::Modified(n)) => n,
                Ok(WatchEvent::Bookmark(b)) => {
                    rv = b.metadata.resource_version;
                    continue;
                }
                _ => continue,
            };
            rv = node.metadata.resource_version.clone().unwrap_or(rv);
            let label = |k: &str| node.metadata.labels.as_ref()?.get(k).cloned();
            let annotation = |k: &str| node.metadata.annotations.as_ref()?.get(k).cloned();
            let seen = Seen {
                at,
                profile: label(PROFILE_LABEL),
                state: label(STATE_LABEL),
                hash: annotation(APPLIED_HASH),
            };
            if tx.send(seen).is_err() {
                return;
            }
        }
    }
}

/// The timestamps of one label change.
#[derive(Debug, Clone, Copy)]
pub struct Change {
    pub label_set: SystemTime,
    pub event: SystemTime,
    pub reconcile: SystemTime,
    pub written: SystemTime,
    pub success: SystemTime,
}

/// The stages reported, each as (row name, from, to).
pub type Stage = (
    &'static str,
    fn(&Change) -> SystemTime,
    fn(&Change) -> SystemTime,
);

pub const STAGES: [Stage; 7] = [
    (
        "label set → watch event at the harness (API double fan-out)",
        |c| c.label_set,
        |c| c.event,
    ),
    (
        "watch event → reconcile start (agent log)",
        |c| c.event,
        |c| c.reconcile,
    ),
    (
        "reconcile start → config written",
        |c| c.reconcile,
        |c| c.written,
    ),
    (
        "**watch event → config written**",
        |c| c.event,
        |c| c.written,
    ),
    (
        "config written → success published (watch event)",
        |c| c.written,
        |c| c.success,
    ),
    (
        "watch event → success published",
        |c| c.event,
        |c| c.success,
    ),
    ("label set → config written", |c| c.label_set, |c| c.written),
];

/// `to - from` in µs, negative when `to` came first: the harness's watch and the agent's get
/// the same fan-out, and either may read it first.
pub fn between(from: SystemTime, to: SystemTime) -> i64 {
    match to.duration_since(from) {
        Ok(d) => d.as_micros() as i64,
        Err(e) => -(e.duration().as_micros() as i64),
    }
}

/// The time of the last line of `log` that contains `what`, from its RFC 3339 UTC timestamp
/// (tracing-subscriber's default, e.g. `2026-12-04T04:39:19.123456Z`).
pub fn last_logged(log: &str, what: &str) -> Option<SystemTime> {
    log.lines()
        .rev()
        .find(|l| l.contains(what))
        .and_then(|l| rfc3339_utc(l.split_whitespace().next()?))
}

/// `YYYY-MM-DDTHH:MM:SS[.fraction]Z` as a SystemTime.
fn rfc3339_utc(text: &str) -> Option<SystemTime> {
    let text = text.strip_suffix('Z')?;
    let (date, time) = text.split_once('T')?;
    let mut ymd = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, d) = (ymd.next()??, ymd.next()??, ymd.next()??);
    let (hms, fraction) = time.split_once('.').unwrap_or((time, "0"));
    let mut parts = hms.split(':').map(|p| p.parse::<i64>().ok());
    let (hh, mm, ss) = (parts.next()??, parts.next()??, parts.next()??);
    let nanos: u32 = format!("{fraction:0<9}")[..9].parse().ok()?;
    let secs = days_from_civil(y, m, d) * 86_400 + hh * 3600 + mm * 60 + ss;
    Some(UNIX_EPOCH + Duration::new(u64::try_from(secs).ok()?, nanos))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Wait for `path`'s bytes to differ from `before`, polling every 0.1 ms; when they did.
pub fn wait_rewritten(path: &Path, before: &[u8], timeout: Duration) -> Option<SystemTime> {
    let deadline = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < deadline {
        if std::fs::read(path).is_ok_and(|now| now != before) {
            return Some(SystemTime::now());
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    None
}

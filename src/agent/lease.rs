//! The fleet drain budget: at most N nodes drain at once, coordinated through
//! coordination.k8s.io/v1 Leases in the agent's namespace (no home-made consensus).
//!
//! There are N slot Leases, `gpu-share-drain-0` … `gpu-share-drain-<N-1>`. A node holds a slot
//! while it cordons, evicts and reconfigures; the apiserver's optimistic concurrency (every
//! write carries the resourceVersion that was read; a stale one gets 409 Conflict, a second
//! create gets 409 AlreadyExists) guarantees that one slot never has two holders.
//!
//! A slot is free when its Lease does not exist yet, has no `holderIdentity`, or its holder let
//! it lapse (`renewTime + leaseDurationSeconds` is in the past — a node that died mid-drain). A
//! slot already held by this node is taken again, so an agent restarted mid-drain keeps its slot
//! instead of waiting for it to expire. Expiry is judged with the local clock against the
//! `renewTime` the holder wrote, so node clocks are assumed to be roughly in sync (NTP); a skew
//! of a few seconds only shortens or lengthens the wait for a dead holder's slot.
//!
//! One holder identity (the node name) must acquire through one [`DrainSlots`] at a time: two
//! acquirers with the same identity would both see the slot as theirs.
//!
//! Why this file is long (about 850 lines, 100 of them unit tests): every part of it (the
//! acquire pass, renewal, release, expiry and the errors that name holders) applies the same
//! optimistic-concurrency rules to the same Lease fields, and reads best in one place.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBuilder};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use tracing::{debug, error, info, warn};

use crate::lease::{holder, holder_of, Holder};

/// Slot Leases are named `gpu-share-drain-<i>`.
pub const SLOT_PREFIX: &str = "gpu-share-drain-";

/// How often `acquire` logs that it is still waiting.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// Attempts for one renew or release when the Lease changed under us (409) or the apiserver
/// had a transient failure.
const WRITE_ATTEMPTS: usize = 3;

/// The name of slot `i`.
pub fn slot_name(i: u32) -> String {
    format!("{SLOT_PREFIX}{i}")
}

/// Why a drain slot could not be taken, kept or given back.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// Every slot stayed held for the whole wait.
    #[error(
        "no drain slot became free within {}: {}{}",
        fmt_duration(*waited),
        describe_holders(holders),
        last_error.as_ref().map(|e| format!(" (last API error: {e})")).unwrap_or_default()
    )]
    Timeout {
        waited: Duration,
        /// `(slot lease, holder)` for the slots held when we gave up.
        holders: Vec<(String, String)>,
        /// The last transient API error seen while waiting, if any.
        last_error: Option<String>,
    },
    /// The apiserver refused or failed a request on a slot Lease: a non-retryable answer
    /// (403, 404 namespace, 422, ...) at once, or a transient one (5xx, 429, connection) that
    /// lasted the whole wait.
    #[error(
        "lease {namespace}/{lease}: {op} failed: {}",
        describe_kube_error(error)
    )]
    Api {
        namespace: String,
        lease: String,
        op: &'static str,
        error: kube::Error,
    },
    /// The slot is no longer ours: it lapsed and another node took it, or it was deleted.
    #[error("lease {namespace}/{lease} is no longer held by {us}: {}", match holder {
        Some(h) => format!("now held by {h}"),
        None => "it is gone or released".to_string(),
    })]
    Lost {
        namespace: String,
        lease: String,
        us: String,
        holder: Option<String>,
    },
}

fn describe_holders(holders: &[(String, String)]) -> String {
    if holders.is_empty() {
        return "no slot could be read or taken".to_string();
    }
    let list: Vec<String> = holders
        .iter()
        .map(|(slot, holder)| format!("{holder} ({slot})"))
        .collect();
    format!("held by {}", list.join(", "))
}

fn fmt_duration(d: Duration) -> String {
    if d.as_secs() >= 1 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// A short description of a kube error: `500 InternalError: message` for API statuses.
fn describe_kube_error(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => {
            let mut out = s.code.to_string();
            if !s.reason.is_empty() {
                out.push(' ');
                out.push_str(&s.reason);
            }
            if !s.message.is_empty() {
                out.push_str(": ");
                out.push_str(&s.message);
            }
            out
        }
        other => other.to_string(),
    }
}

/// Worth retrying: server-side failures, throttling, and connection-level errors.
fn is_transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code >= 500 || s.code == 429,
        kube::Error::HyperError(_)
        | kube::Error::Service(_)
        | kube::Error::ReadEvents(_)
        | kube::Error::Auth(_) => true,
        _ => false,
    }
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.is_conflict())
}

fn is_already_exists(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.is_already_exists() || (s.code == 409 && s.reason.is_empty()))
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.is_not_found())
}

/// `leaseDurationSeconds` for a duration: whole seconds, rounded up, at least 1.
fn duration_secs(d: Duration) -> i32 {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    secs.clamp(1, i32::MAX as u64) as i32
}

/// What a slot's Lease means for us: [`crate::lease`]'s rule, with the reader's default
/// duration rounded up as the slots write it.
fn slot_state(lease: &Lease, us: &str, now: Timestamp, default_secs: i32) -> Holder {
    let default = Duration::from_secs(default_secs.max(0) as u64);
    holder(lease, us, now, default)
}

/// Shared by a [`DrainSlots`] and the slots it hands out.
#[derive(Clone)]
struct Ctx {
    api: Api<Lease>,
    namespace: String,
    holder: String,
    lease_duration: Duration,
}

impl Ctx {
    /// The longest one API call may take. kube's client retries 429, 503 and 504 on its own
    /// with a backoff that can grow to minutes, so every call is bounded; running out counts as
    /// a transient failure.
    fn call_timeout(&self) -> Duration {
        (self.lease_duration / 3).clamp(Duration::from_secs(1), Duration::from_secs(10))
    }

    async fn call<T>(
        &self,
        request: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, kube::Error> {
        let limit = self.call_timeout();
        match tokio::time::timeout(limit, request).await {
            Ok(r) => r,
            Err(_) => Err(kube::Error::Service(
                format!(
                    "no answer within {} (the client retries 429, 503 and 504 itself)",
                    fmt_duration(limit)
                )
                .into(),
            )),
        }
    }

    fn api_error(&self, lease: &str, op: &'static str, error: kube::Error) -> LeaseError {
        LeaseError::Api {
            namespace: self.namespace.clone(),
            lease: lease.to_string(),
            op,
            error,
        }
    }

    fn lost(&self, lease: &str, holder: Option<String>) -> LeaseError {
        LeaseError::Lost {
            namespace: self.namespace.clone(),
            lease: lease.to_string(),
            us: self.holder.clone(),
            holder,
        }
    }

    /// Writes us into `lease` as holder, conditional on the resourceVersion it was read at.
    async fn take(&self, name: &str, mut lease: Lease) -> Result<Lease, kube::Error> {
        let now = MicroTime(Timestamp::now());
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        let previous = spec.holder_identity.clone().filter(|h| !h.is_empty());
        if previous.as_deref() != Some(self.holder.as_str()) {
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
            spec.acquire_time = Some(now.clone());
        }
        spec.holder_identity = Some(self.holder.clone());
        spec.renew_time = Some(now);
        spec.lease_duration_seconds = Some(duration_secs(self.lease_duration));
        self.call(self.api.replace(
            name,
            &crate::field_manager::post(crate::field_manager::AGENT),
            &lease,
        ))
        .await
    }

    async fn create(&self, name: &str) -> Result<Lease, kube::Error> {
        let now = MicroTime(Timestamp::now());
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(self.namespace.clone()),
                labels: Some(
                    [(
                        "app.kubernetes.io/managed-by".to_string(),
                        "gpu-share".to_string(),
                    )]
                    .into(),
                ),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.holder.clone()),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_duration_seconds: Some(duration_secs(self.lease_duration)),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        self.call(self.api.create(
            &crate::field_manager::post(crate::field_manager::AGENT),
            &lease,
        ))
        .await
    }

    /// Renews `name` if we still hold it.
    async fn renew(&self, name: &str) -> Result<(), LeaseError> {
        let mut last = None;
        for _ in 0..WRITE_ATTEMPTS {
            let lease = match self.call(self.api.get_opt(name)).await {
                Ok(Some(l)) => l,
                Ok(None) => return Err(self.lost(name, None)),
                Err(e) if is_transient(&e) => {
                    last = Some(self.api_error(name, "get", e));
                    continue;
                }
                Err(e) => return Err(self.api_error(name, "get", e)),
            };
            match holder_of(&lease) {
                Some(h) if h == self.holder => {}
                other => return Err(self.lost(name, other.map(str::to_string))),
            }
            match self.take(name, lease).await {
                Ok(_) => return Ok(()),
                // Changed since we read it (or a transient failure): read again.
                Err(e) if is_conflict(&e) || is_transient(&e) => {
                    last = Some(self.api_error(name, "update", e));
                }
                Err(e) => return Err(self.api_error(name, "update", e)),
            }
        }
        Err(last.expect("at least one attempt"))
    }

    /// Clears `holderIdentity` of `name` if we hold it. A missing Lease, or one another node
    /// holds by now, is fine.
    async fn release(&self, name: &str) -> Result<(), LeaseError> {
        let mut last = None;
        for _ in 0..WRITE_ATTEMPTS {
            let mut lease = match self.call(self.api.get_opt(name)).await {
                Ok(Some(l)) => l,
                Ok(None) => return Ok(()),
                Err(e) if is_transient(&e) => {
                    last = Some(self.api_error(name, "get", e));
                    continue;
                }
                Err(e) => return Err(self.api_error(name, "get", e)),
            };
            match holder_of(&lease) {
                Some(h) if h == self.holder => {}
                Some(h) => {
                    warn!(
                        lease = name,
                        holder = h,
                        "drain slot already taken over by another node"
                    );
                    return Ok(());
                }
                None => return Ok(()),
            }
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            spec.holder_identity = None;
            spec.renew_time = Some(MicroTime(Timestamp::now()));
            match self
                .call(self.api.replace(
                    name,
                    &crate::field_manager::post(crate::field_manager::AGENT),
                    &lease,
                ))
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) if is_not_found(&e) => return Ok(()),
                Err(e) if is_conflict(&e) || is_transient(&e) => {
                    last = Some(self.api_error(name, "update", e));
                }
                Err(e) => return Err(self.api_error(name, "update", e)),
            }
        }
        Err(last.expect("at least one attempt"))
    }
}

/// The fleet's drain slots, as seen by one node.
#[derive(Clone)]
pub struct DrainSlots {
    ctx: Ctx,
    slots: u32,
}

/// The outcome of one pass over the slots.
enum Pass {
    Acquired(Box<DrainSlot>),
    Busy {
        holders: Vec<(String, String)>,
        last_error: Option<LeaseError>,
    },
}

impl DrainSlots {
    /// `slots` slot Leases in `namespace`, taken as `holder` (the node name) for
    /// `lease_duration` at a time. `slots` below 1 is taken as 1.
    pub fn new(
        client: kube::Client,
        namespace: &str,
        holder: &str,
        slots: u32,
        lease_duration: Duration,
    ) -> Self {
        if slots == 0 {
            warn!("a drain budget of 0 slots would never let a node drain; using 1");
        }
        DrainSlots {
            ctx: Ctx {
                api: Api::namespaced(client, namespace),
                namespace: namespace.to_string(),
                holder: holder.to_string(),
                lease_duration,
            },
            slots: slots.max(1),
        }
    }

    pub fn holder(&self) -> &str {
        &self.ctx.holder
    }

    pub fn slots(&self) -> u32 {
        self.slots
    }

    pub fn lease_duration(&self) -> Duration {
        self.ctx.lease_duration
    }

    /// Takes a slot, waiting up to `wait_up_to` for one to become free (a zero wait tries
    /// once). A slot this node already holds (an agent restarted mid-drain) is taken first.
    ///
    /// Transient API failures (5xx, 429, connection errors) are retried until the wait ends;
    /// any other API error (403, 422, a missing namespace) is returned at once. While waiting,
    /// progress is logged at info level every ~10 s.
    pub async fn acquire(&self, wait_up_to: Duration) -> Result<DrainSlot, LeaseError> {
        let started = Instant::now();
        let mut backoff = self.backoff();
        let mut last_progress: Option<Instant> = None;
        loop {
            let (holders, last_error) = match self.pass().await? {
                Pass::Acquired(slot) => {
                    info!(
                        lease = slot.name(),
                        waited_ms = started.elapsed().as_millis() as u64,
                        "drain slot acquired"
                    );
                    return Ok(*slot);
                }
                Pass::Busy {
                    holders,
                    last_error,
                } => (holders, last_error),
            };
            let waited = started.elapsed();
            if waited >= wait_up_to {
                return Err(match last_error {
                    // Nothing held by anyone, and the API kept failing: that error is the cause.
                    Some(e) if holders.is_empty() => e,
                    e => LeaseError::Timeout {
                        waited,
                        holders,
                        last_error: e.map(|e| e.to_string()),
                    },
                });
            }
            if let Some(e) = &last_error {
                warn!(error = %e, "drain slot: API error, retrying");
            }
            if last_progress.is_none_or(|t| t.elapsed() >= PROGRESS_EVERY) {
                last_progress = Some(Instant::now());
                let held: Vec<&str> = holders.iter().map(|(_, h)| h.as_str()).collect();
                info!(
                    slots = self.slots,
                    waited_s = waited.as_secs(),
                    timeout_s = wait_up_to.as_secs(),
                    "waiting for a drain slot: held by {}",
                    if held.is_empty() {
                        "(unknown)".to_string()
                    } else {
                        held.join(", ")
                    }
                );
            }
            let delay = backoff.next().unwrap_or(self.max_poll());
            tokio::time::sleep(delay.min(wait_up_to - waited)).await;
        }
    }

    /// Who holds which slot now: `(slot lease, holder)`, lapsed holders left out. For
    /// messages; slots that cannot be read are left out too.
    pub async fn held_by(&self) -> Vec<(String, String)> {
        let now = Timestamp::now();
        let default_secs = duration_secs(self.ctx.lease_duration);
        let mut out = Vec::new();
        for i in 0..self.slots {
            let name = slot_name(i);
            match self.ctx.call(self.ctx.api.get_opt(&name)).await {
                Ok(Some(lease)) => match slot_state(&lease, &self.ctx.holder, now, default_secs) {
                    Holder::Us => out.push((name, self.ctx.holder.clone())),
                    Holder::Other(h) => out.push((name, h)),
                    Holder::Free | Holder::Lapsed(_) => {}
                },
                Ok(None) => {}
                Err(e) => {
                    debug!(lease = %name, error = %describe_kube_error(&e), "cannot read drain slot")
                }
            }
        }
        out
    }

    /// Gives back every slot this node holds (for start-up when no drain is in progress: a
    /// slot left by a crash after the drain finished need not wait for expiry). Returns how
    /// many were released.
    pub async fn release_own(&self) -> Result<usize, LeaseError> {
        let mut released = 0;
        for i in 0..self.slots {
            let name = slot_name(i);
            let lease = match self.ctx.call(self.ctx.api.get_opt(&name)).await {
                Ok(l) => l,
                Err(e) => return Err(self.ctx.api_error(&name, "get", e)),
            };
            if lease.as_ref().and_then(holder_of) == Some(self.ctx.holder.as_str()) {
                self.ctx.release(&name).await?;
                info!(lease = %name, "released a drain slot left from an earlier run");
                released += 1;
            }
        }
        Ok(released)
    }

    fn max_poll(&self) -> Duration {
        (self.ctx.lease_duration / 2).clamp(Duration::from_millis(200), Duration::from_secs(5))
    }

    fn backoff(&self) -> impl Iterator<Item = Duration> {
        let max = self.max_poll();
        let min = (self.ctx.lease_duration / 10).clamp(Duration::from_millis(50), max);
        ExponentialBuilder::new()
            .with_min_delay(min)
            .with_max_delay(max)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times()
            .build()
    }

    /// One pass: read every slot, take our own if we hold one, else the first free or lapsed
    /// one that we win.
    async fn pass(&self) -> Result<Pass, LeaseError> {
        let ctx = &self.ctx;
        let now = Timestamp::now();
        let default_secs = duration_secs(ctx.lease_duration);
        let mut last_error = None;
        let mut observed = Vec::with_capacity(self.slots as usize);
        for i in 0..self.slots {
            let name = slot_name(i);
            match ctx.call(ctx.api.get_opt(&name)).await {
                Ok(lease) => observed.push((name, lease)),
                Err(e) if is_transient(&e) => last_error = Some(ctx.api_error(&name, "get", e)),
                Err(e) => return Err(ctx.api_error(&name, "get", e)),
            }
        }

        // Crash safety: a slot we already hold is ours again.
        let ours = observed.iter().find(|(_, l)| {
            l.as_ref()
                .is_some_and(|l| holder_of(l) == Some(ctx.holder.as_str()))
        });
        if let Some((name, Some(lease))) = ours {
            match ctx.take(name, lease.clone()).await {
                Ok(_) => {
                    info!(lease = %name, "re-acquired the drain slot this node already held");
                    return Ok(Pass::Acquired(Box::new(DrainSlot::new(
                        ctx.clone(),
                        name.clone(),
                    ))));
                }
                // Someone wrote it since we read it; it may have lapsed and been taken.
                Err(e) if is_conflict(&e) => debug!(lease = %name, "own slot changed, re-reading"),
                Err(e) if is_transient(&e) => last_error = Some(ctx.api_error(name, "update", e)),
                Err(e) => return Err(ctx.api_error(name, "update", e)),
            }
            return Ok(Pass::Busy {
                holders: Vec::new(),
                last_error,
            });
        }

        let mut holders = Vec::new();
        for (name, lease) in observed {
            let result = match lease {
                None => match ctx.create(&name).await {
                    Ok(_) => Ok(()),
                    Err(e) if is_already_exists(&e) => {
                        debug!(lease = %name, "another node created this drain slot first");
                        continue;
                    }
                    Err(e) => Err((e, "create")),
                },
                Some(lease) => match slot_state(&lease, &ctx.holder, now, default_secs) {
                    Holder::Other(h) => {
                        holders.push((name, h));
                        continue;
                    }
                    state => {
                        if let Holder::Lapsed(h) = &state {
                            info!(lease = %name, previous = %h, "taking over a drain slot whose holder let it lapse");
                        }
                        match ctx.take(&name, lease).await {
                            Ok(_) => Ok(()),
                            Err(e) if is_conflict(&e) => {
                                debug!(lease = %name, "lost the race for this drain slot");
                                continue;
                            }
                            Err(e) => Err((e, "update")),
                        }
                    }
                },
            };
            match result {
                Ok(()) => return Ok(Pass::Acquired(Box::new(DrainSlot::new(ctx.clone(), name)))),
                Err((e, op)) if is_transient(&e) => last_error = Some(ctx.api_error(&name, op, e)),
                Err((e, op)) => return Err(ctx.api_error(&name, op, e)),
            }
        }
        Ok(Pass::Busy {
            holders,
            last_error,
        })
    }
}

/// A drain slot this node holds. Keep it renewed ([`DrainSlot::spawn_renewal`]) while the
/// drain runs and [`DrainSlot::release`] it afterwards. Dropping it without release stops the
/// renewal and leaves the Lease to lapse after its duration (as a crash would).
pub struct DrainSlot {
    ctx: Ctx,
    name: String,
    lost: Arc<AtomicBool>,
    renewal: Mutex<Option<tokio::task::AbortHandle>>,
}

impl std::fmt::Debug for DrainSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DrainSlot")
            .field("namespace", &self.ctx.namespace)
            .field("name", &self.name)
            .field("holder", &self.ctx.holder)
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl DrainSlot {
    fn new(ctx: Ctx, name: String) -> Self {
        DrainSlot {
            ctx,
            name,
            lost: Arc::new(AtomicBool::new(false)),
            renewal: Mutex::new(None),
        }
    }

    /// The slot Lease's name (`gpu-share-drain-<i>`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The holder identity (node name).
    pub fn holder(&self) -> &str {
        &self.ctx.holder
    }

    /// Whether a renewal found the slot taken over or deleted.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Relaxed)
    }

    /// Renews the Lease now. [`LeaseError::Lost`] when another node holds it by now.
    pub async fn renew(&self) -> Result<(), LeaseError> {
        let r = self.ctx.renew(&self.name).await;
        if matches!(r, Err(LeaseError::Lost { .. })) {
            self.lost.store(true, Ordering::Relaxed);
        }
        r
    }

    /// Renews the Lease every third of its duration in a background task, until the slot is
    /// released or dropped or the task is aborted. Failures are logged; the task ends if the
    /// slot was lost. A second call replaces the first task.
    pub fn spawn_renewal(&self) -> tokio::task::JoinHandle<()> {
        let ctx = self.ctx.clone();
        let name = self.name.clone();
        let lost = Arc::clone(&self.lost);
        let every = (ctx.lease_duration / 3).max(Duration::from_millis(100));
        let handle = tokio::spawn(async move {
            let mut last_ok = Instant::now();
            loop {
                tokio::time::sleep(every).await;
                match ctx.renew(&name).await {
                    Ok(()) => {
                        debug!(lease = %name, "drain slot renewed");
                        last_ok = Instant::now();
                    }
                    Err(e @ LeaseError::Lost { .. }) => {
                        lost.store(true, Ordering::Relaxed);
                        error!(error = %e, "drain slot lost; another node may be draining too");
                        return;
                    }
                    Err(e) => {
                        if last_ok.elapsed() >= ctx.lease_duration {
                            error!(error = %e, "cannot renew the drain slot; it may lapse");
                        } else {
                            warn!(error = %e, "cannot renew the drain slot, retrying");
                        }
                    }
                }
            }
        });
        let mut slot = self.renewal.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(previous) = slot.replace(handle.abort_handle()) {
            previous.abort();
        }
        handle
    }

    fn stop_renewal(&self) {
        if let Some(h) = self
            .renewal
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            h.abort();
        }
    }

    /// Gives the slot back (clears `holderIdentity`); errors are logged, and the Lease then
    /// lapses on its own after its duration.
    pub async fn release(self) {
        let name = self.name.clone();
        match self.try_release().await {
            Ok(()) => info!(lease = %name, "drain slot released"),
            Err(e) => warn!(error = %e, "could not release the drain slot; it will lapse"),
        }
    }

    /// [`DrainSlot::release`], returning the error. A missing Lease, or one another node holds
    /// by now, is not an error.
    pub async fn try_release(self) -> Result<(), LeaseError> {
        self.stop_renewal();
        self.ctx.release(&self.name).await
    }
}

impl Drop for DrainSlot {
    fn drop(&mut self) {
        self.stop_renewal();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: Option<&str>, renewed_ms_ago: Option<i64>, secs: Option<i32>) -> Lease {
        let now = Timestamp::now().as_millisecond();
        Lease {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                renew_time: renewed_ms_ago
                    .map(|ago| MicroTime(Timestamp::from_millisecond(now - ago).unwrap())),
                lease_duration_seconds: secs,
                ..Default::default()
            }),
        }
    }

    #[test]
    fn slot_states() {
        let now = Timestamp::now();
        let st = |l: &Lease| slot_state(l, "me", now, 15);
        assert_eq!(st(&lease(None, None, None)), Holder::Free);
        assert_eq!(st(&lease(Some(""), Some(0), Some(15))), Holder::Free);
        assert_eq!(st(&lease(Some("me"), Some(99_000), Some(1))), Holder::Us);
        assert_eq!(
            st(&lease(Some("a"), Some(500), Some(1))),
            Holder::Other("a".into())
        );
        assert_eq!(
            st(&lease(Some("a"), Some(2_000), Some(1))),
            Holder::Lapsed("a".into())
        );
        // No duration on the Lease: ours (15 s) applies.
        assert_eq!(
            st(&lease(Some("a"), Some(10_000), None)),
            Holder::Other("a".into())
        );
        // A holder that never wrote a time cannot be renewing.
        assert_eq!(
            st(&lease(Some("a"), None, Some(30))),
            Holder::Lapsed("a".into())
        );
        assert_eq!(
            slot_state(
                &Lease {
                    metadata: ObjectMeta::default(),
                    spec: None
                },
                "me",
                now,
                15
            ),
            Holder::Free
        );
    }

    #[test]
    fn lease_duration_rounds_up() {
        assert_eq!(duration_secs(Duration::from_millis(1)), 1);
        assert_eq!(duration_secs(Duration::from_secs(1)), 1);
        assert_eq!(duration_secs(Duration::from_millis(1500)), 2);
        assert_eq!(duration_secs(Duration::ZERO), 1);
        assert_eq!(duration_secs(Duration::from_secs(u64::MAX)), i32::MAX);
    }

    #[test]
    fn timeout_message_names_holders() {
        let e = LeaseError::Timeout {
            waited: Duration::from_secs(30),
            holders: vec![
                ("gpu-share-drain-0".into(), "node-a".into()),
                ("gpu-share-drain-1".into(), "node-b".into()),
            ],
            last_error: None,
        };
        assert_eq!(
            e.to_string(),
            "no drain slot became free within 30s: held by node-a (gpu-share-drain-0), node-b (gpu-share-drain-1)"
        );
    }

    #[test]
    fn api_error_message_names_lease_and_status() {
        let status = kube::core::Status::failure("boom", "InternalError").with_code(500);
        let e = LeaseError::Api {
            namespace: "gpu-share".into(),
            lease: "gpu-share-drain-0".into(),
            op: "update",
            error: kube::Error::Api(status.boxed()),
        };
        assert_eq!(
            e.to_string(),
            "lease gpu-share/gpu-share-drain-0: update failed: 500 InternalError: boom"
        );
        assert!(matches!(&e, LeaseError::Api { error, .. } if is_transient(error)));
    }
}

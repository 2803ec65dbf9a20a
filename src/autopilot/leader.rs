//! One active autopilot replica: leader election over a coordination.k8s.io/v1 Lease, as
//! client-go's leaderelection does it (who holds it: [`crate::lease`], shared with the drain
//! slots; holderIdentity, renewTime + leaseDurationSeconds, the
//! apiserver's optimistic concurrency deciding races: a stale resourceVersion gets 409 Conflict,
//! a second create 409 AlreadyExists).
//!
//! A replica takes the Lease when it does not exist, has no holder, is its own (a restart with
//! the same identity resumes at once) or its holder let it lapse. It renews every third of the
//! duration; when it cannot renew for a whole duration, or finds another holder, it must stop
//! acting: [`Leadership::lost`] resolves and the run loop ends the process (its Deployment
//! starts it again, and it then waits for the Lease like any other replica).

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use tokio::sync::watch;
use tracing::{info, warn};

pub use crate::lease::{holder, Holder};

/// What one attempt to take or renew the Lease found.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Attempt {
    /// This replica holds it.
    Ours,
    /// Another holds it: who, as said in logs.
    HeldBy(String),
}

/// The autopilot's Lease, taken as one identity.
#[derive(Clone)]
pub struct Leader {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
}

/// Held leadership: `lost` resolves when this replica must stop acting.
pub struct Leadership {
    lost: watch::Receiver<Option<String>>,
    renewal: tokio::task::JoinHandle<()>,
    leader: Leader,
}

impl Leader {
    pub fn new(
        client: kube::Client,
        namespace: &str,
        name: &str,
        identity: &str,
        duration: Duration,
    ) -> Self {
        Leader {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            identity: identity.to_string(),
            duration: duration.max(Duration::from_secs(1)),
        }
    }

    /// Wait until this replica holds the Lease, then keep renewing it in the background.
    pub async fn acquire(&self) -> Leadership {
        let mut waiting_logged = false;
        loop {
            match self.try_take().await {
                Ok(Attempt::Ours) => break,
                Ok(Attempt::HeldBy(holder)) if !waiting_logged => {
                    info!(lease = %self.name, %holder, "another replica leads; waiting for the lease");
                    waiting_logged = true;
                }
                Ok(Attempt::HeldBy(_)) => {}
                Err(e) => {
                    warn!(lease = %self.name, error = %e, "cannot read or take the lease; retrying")
                }
            }
            tokio::time::sleep(self.retry_period()).await;
        }
        info!(lease = %self.name, identity = %self.identity, "leading");
        let (tx, lost) = watch::channel(None);
        let renewal = tokio::spawn(self.clone().keep(tx));
        Leadership {
            lost,
            renewal,
            leader: self.clone(),
        }
    }

    /// How often a waiting replica tries again: half the duration, at most 5 s.
    fn retry_period(&self) -> Duration {
        (self.duration / 2).min(Duration::from_secs(5))
    }

    /// One attempt: [`Attempt::Ours`] when taken, [`Attempt::HeldBy`] when someone else leads.
    async fn try_take(&self) -> kube::Result<Attempt> {
        let now = Timestamp::now();
        let Some(lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: Some(self.spec(now, None)),
            };
            return match self
                .api
                .create(
                    &crate::field_manager::post(crate::field_manager::AUTOPILOT),
                    &lease,
                )
                .await
            {
                Ok(_) => Ok(Attempt::Ours),
                Err(e) if is_code(&e, 409) => {
                    Ok(Attempt::HeldBy("(a replica that created it first)".into()))
                }
                Err(e) => Err(e),
            };
        };
        let previous = match holder(&lease, &self.identity, now, self.duration) {
            Holder::Other(h) => return Ok(Attempt::HeldBy(h)),
            Holder::Lapsed(h) => {
                info!(lease = %self.name, previous = %h, "taking over a lease its holder let lapse");
                Some(h)
            }
            Holder::Free => Some(String::new()),
            Holder::Us => None,
        };
        let mut taken = lease.clone();
        let transitions = lease.spec.as_ref().and_then(|s| s.lease_transitions);
        let mut spec = self.spec(now, transitions);
        if previous.is_none() {
            // Ours already (a restart): keep acquireTime and the transition count.
            spec.acquire_time = lease.spec.as_ref().and_then(|s| s.acquire_time.clone());
            spec.lease_transitions = transitions;
        }
        taken.spec = Some(spec);
        match self
            .api
            .replace(
                &self.name,
                &crate::field_manager::post(crate::field_manager::AUTOPILOT),
                &taken,
            )
            .await
        {
            Ok(_) => Ok(Attempt::Ours),
            Err(e) if is_code(&e, 409) => {
                Ok(Attempt::HeldBy("(a replica that took it first)".into()))
            }
            Err(e) => Err(e),
        }
    }

    /// The spec of a Lease this replica takes now (transitions counted up from `transitions`).
    fn spec(&self, now: Timestamp, transitions: Option<i32>) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.duration.as_secs().max(1) as i32),
            acquire_time: Some(MicroTime(now)),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions.map_or(0, |t| t + 1)),
            ..Default::default()
        }
    }

    /// Renew now: [`Attempt::HeldBy`] when another replica holds the Lease by now.
    async fn renew(&self) -> kube::Result<Attempt> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(Attempt::HeldBy("nobody (it was deleted)".into()));
        };
        match holder(&lease, &self.identity, Timestamp::now(), self.duration) {
            Holder::Us => {}
            Holder::Free => return Ok(Attempt::HeldBy("nobody (it was released)".into())),
            Holder::Lapsed(h) | Holder::Other(h) => return Ok(Attempt::HeldBy(h)),
        }
        if let Some(spec) = lease.spec.as_mut() {
            spec.renew_time = Some(MicroTime(Timestamp::now()));
        }
        self.api
            .replace(
                &self.name,
                &crate::field_manager::post(crate::field_manager::AUTOPILOT),
                &lease,
            )
            .await?;
        Ok(Attempt::Ours)
    }

    /// Renew every third of the duration; say why on `lost` when leadership ends.
    async fn keep(self, lost: watch::Sender<Option<String>>) {
        let every = (self.duration / 3).max(Duration::from_millis(100));
        let mut last_ok = Instant::now();
        loop {
            tokio::time::sleep(every).await;
            let why = match self.renew().await {
                Ok(Attempt::Ours) => {
                    last_ok = Instant::now();
                    continue;
                }
                Ok(Attempt::HeldBy(h)) => format!("lease {} is held by {h} now", self.name),
                Err(e) if last_ok.elapsed() < self.duration => {
                    warn!(lease = %self.name, error = %e, "cannot renew the lease; retrying");
                    continue;
                }
                Err(e) => format!(
                    "lease {} not renewed for {}s, another replica may lead: {e}",
                    self.name,
                    self.duration.as_secs()
                ),
            };
            let _ = lost.send(Some(why));
            return;
        }
    }

    /// Give the Lease back (no holder) if this replica holds it, so another replica takes over
    /// at once. Also called when SIGTERM cuts [`Leader::acquire`] short: its write may have
    /// landed. A conflict (a renewal or acquire whose write was in flight when it was
    /// stopped) is read again and retried once.
    pub async fn release(&self) {
        for _ in 0..2 {
            let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await else {
                return;
            };
            if holder(&lease, &self.identity, Timestamp::now(), self.duration) != Holder::Us {
                return;
            }
            if let Some(spec) = lease.spec.as_mut() {
                spec.holder_identity = None;
            }
            match self
                .api
                .replace(
                    &self.name,
                    &crate::field_manager::post(crate::field_manager::AUTOPILOT),
                    &lease,
                )
                .await
            {
                Ok(_) => {
                    info!(lease = %self.name, "lease released");
                    return;
                }
                Err(e) if is_code(&e, 409) => continue,
                Err(e) => {
                    warn!(lease = %self.name, error = %e, "could not release the lease; it will lapse");
                    return;
                }
            }
        }
        warn!(lease = %self.name, "could not release the lease (it kept changing); it will lapse");
    }
}

impl Leadership {
    /// Resolves with the reason when this replica no longer leads.
    pub async fn lost(&mut self) -> String {
        loop {
            if let Some(why) = self.lost.borrow().clone() {
                return why;
            }
            if self.lost.changed().await.is_err() {
                return "the lease renewal stopped".into();
            }
        }
    }

    /// Stop renewing and give the Lease back (on SIGTERM).
    pub async fn release(self) {
        self.renewal.abort();
        self.leader.release().await;
    }
}

fn is_code(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::SignedDuration;

    fn lease(holder: Option<&str>, renewed_secs_ago: Option<i64>, duration: Option<i32>) -> Lease {
        let now = Timestamp::now();
        Lease {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                renew_time: renewed_secs_ago.map(|s| MicroTime(now - SignedDuration::from_secs(s))),
                lease_duration_seconds: duration,
                ..Default::default()
            }),
        }
    }

    #[test]
    fn who_holds_the_lease() {
        let now = Timestamp::now();
        let d = Duration::from_secs(15);
        let h = |l: &Lease| holder(l, "me", now, d);
        assert_eq!(h(&lease(None, None, None)), Holder::Free);
        assert_eq!(h(&lease(Some(""), Some(0), Some(15))), Holder::Free);
        assert_eq!(h(&lease(Some("me"), Some(999), Some(1))), Holder::Us);
        assert_eq!(
            h(&lease(Some("b"), Some(2), Some(15))),
            Holder::Other("b".into())
        );
        assert_eq!(
            h(&lease(Some("b"), Some(20), Some(15))),
            Holder::Lapsed("b".into())
        );
        // No duration written: the default applies.
        assert_eq!(
            h(&lease(Some("b"), Some(20), None)),
            Holder::Lapsed("b".into())
        );
        assert_eq!(
            h(&lease(Some("b"), Some(5), None)),
            Holder::Other("b".into())
        );
        // Never renewed: lapsed.
        assert_eq!(
            h(&lease(Some("b"), None, Some(15))),
            Holder::Lapsed("b".into())
        );
    }
}

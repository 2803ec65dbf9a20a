//! Who holds a coordination.k8s.io/v1 Lease: the one rule the agent's drain slots
//! (`agent::lease`) and the autopilot's leader election (`autopilot::leader`) both follow.
//! Before, each had its own copy, and they disagreed on a zero duration and on a Lease that
//! expires exactly now.
//!
//! The rule is client-go's leaderelection (`tools/leaderelection/leaderelection.go`,
//! `tryAcquireOrRenew` and `isLeaseValid`): a Lease whose `holderIdentity` is empty is free; a
//! holder's claim is valid while `renewTime + leaseDurationSeconds` is strictly after now, so a
//! Lease expiring exactly now has lapsed, and a duration of 0 (or less) lapses at once, since
//! no instant is strictly after `renewTime + 0`. Where client-go reads no time it has none to
//! trust: a holder that wrote neither `renewTime` nor `acquireTime` has lapsed. A Lease that
//! states no duration gets the reader's own. One difference: client-go times the claim from
//! when *it* observed the record change (its own clock), where this reads the holder's
//! `renewTime`; with clocks skewed by more than a fraction of the duration a holder can look
//! lapsed early or late. Nodes of one cluster keep their clocks in sync (the kubelet's
//! certificates and the API server's token checks need it), and a renewal every third of the
//! duration leaves that margin.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// Who holds a Lease, as one holder candidate sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// No holder: free to take.
    Free,
    /// The candidate itself.
    Us,
    /// Another holder whose claim has lapsed: free to take.
    Lapsed(String),
    /// Another holder, still valid.
    Other(String),
}

/// The holder a Lease names, if any (an empty `holderIdentity` names none).
pub fn holder_of(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
}

/// Whether the Lease's holder claim is still valid at `now` (see the module doc);
/// `default_duration` applies when the Lease states none.
pub fn is_valid(lease: &Lease, now: Timestamp, default_duration: Duration) -> bool {
    let Some(spec) = lease.spec.as_ref() else {
        return false;
    };
    let Some(last) = spec.renew_time.as_ref().or(spec.acquire_time.as_ref()) else {
        return false;
    };
    let secs = spec
        .lease_duration_seconds
        .map_or(default_duration.as_secs() as i64, i64::from);
    if secs <= 0 {
        return false;
    }
    last.0 + SignedDuration::from_secs(secs) > now
}

/// Who holds `lease` at `now`, for candidate `us`.
pub fn holder(lease: &Lease, us: &str, now: Timestamp, default_duration: Duration) -> Holder {
    match holder_of(lease) {
        None => Holder::Free,
        Some(h) if h == us => Holder::Us,
        Some(h) if is_valid(lease, now, default_duration) => Holder::Other(h.to_string()),
        Some(h) => Holder::Lapsed(h.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};

    const D: Duration = Duration::from_secs(15);

    fn lease(holder: Option<&str>, renewed: Option<Timestamp>, secs: Option<i32>) -> Lease {
        Lease {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                renew_time: renewed.map(MicroTime),
                lease_duration_seconds: secs,
                ..Default::default()
            }),
        }
    }

    fn ago(now: Timestamp, secs: i64) -> Option<Timestamp> {
        Some(now - SignedDuration::from_secs(secs))
    }

    #[test]
    fn free_ours_valid_and_lapsed() {
        let now = Timestamp::now();
        let h = |l: &Lease| holder(l, "me", now, D);
        assert_eq!(h(&lease(None, None, None)), Holder::Free);
        assert_eq!(
            h(&lease(Some(""), ago(now, 0), Some(15))),
            Holder::Free,
            "holder gone"
        );
        let no_spec = Lease {
            metadata: ObjectMeta::default(),
            spec: None,
        };
        assert_eq!(h(&no_spec), Holder::Free);
        assert_eq!(h(&lease(Some("me"), ago(now, 999), Some(1))), Holder::Us);
        assert_eq!(
            h(&lease(Some("b"), ago(now, 2), Some(15))),
            Holder::Other("b".into())
        );
        assert_eq!(
            h(&lease(Some("b"), ago(now, 20), Some(15))),
            Holder::Lapsed("b".into())
        );
        assert_eq!(
            h(&lease(Some("b"), None, Some(15))),
            Holder::Lapsed("b".into()),
            "never renewed"
        );
    }

    #[test]
    fn the_edges_follow_client_go() {
        let now = Timestamp::now();
        let h = |l: &Lease| holder(l, "me", now, D);
        // Expiring exactly now: client-go's `After` is strict, so the claim has lapsed.
        assert_eq!(
            h(&lease(Some("b"), ago(now, 15), Some(15))),
            Holder::Lapsed("b".into())
        );
        assert_eq!(
            h(&lease(Some("b"), ago(now, 14), Some(15))),
            Holder::Other("b".into())
        );
        // A duration of 0 or less lapses at once (renewTime + 0 is never after now).
        assert_eq!(
            h(&lease(Some("b"), ago(now, 0), Some(0))),
            Holder::Lapsed("b".into())
        );
        assert_eq!(
            h(&lease(Some("b"), ago(now, 0), Some(-5))),
            Holder::Lapsed("b".into())
        );
        // No duration stated: the reader's own.
        assert_eq!(
            h(&lease(Some("b"), ago(now, 10), None)),
            Holder::Other("b".into())
        );
        assert_eq!(
            h(&lease(Some("b"), ago(now, 20), None)),
            Holder::Lapsed("b".into())
        );
        // Clock skew: a holder whose clock runs 5 s ahead wrote a renewTime in our future; its
        // claim holds for the duration after that time (see the module doc).
        let ahead = Some(now + SignedDuration::from_secs(5));
        assert_eq!(
            h(&lease(Some("b"), ahead, Some(15))),
            Holder::Other("b".into())
        );
        assert!(!is_valid(
            &lease(Some("b"), ahead, Some(15)),
            now + SignedDuration::from_secs(20),
            D
        ));
    }
}

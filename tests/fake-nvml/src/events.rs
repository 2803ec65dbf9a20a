//! NVML events (`nvmlEventSet*`, `nvmlDeviceRegisterEvents`): what a GPU raised, and which of
//! those an event set has yet to deliver.
//!
//! Events live in the state file (`Gpu::events`), so a test raises an XID in a running client
//! by rewriting the file ([`Gpu::raise_xid`] then `State::write_to`); the client's next
//! `nvmlEventSetWait` picks it up. As with the real driver, an event set only delivers events
//! raised after the device was registered with it (nvml.h, `nvmlDeviceRegisterEvents`: "events
//! that occurred before the registration are not recorded").

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::state::Gpu;

/// `nvmlEventTypeSingleBitEccError` (nvml.h).
pub const SINGLE_BIT_ECC: u64 = 0x1;
/// `nvmlEventTypeDoubleBitEccError`.
pub const DOUBLE_BIT_ECC: u64 = 0x2;
/// `nvmlEventTypeXidCriticalError`: `eventData` is the XID.
pub const XID_CRITICAL: u64 = 0x8;

/// One event a GPU raised.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Position in this GPU's event stream, from 1; event sets remember the last one delivered.
    pub seq: u64,
    /// One `nvmlEventType*` bit.
    pub event_type: u64,
    /// `eventData`: the XID for an XID event, else 0.
    #[serde(default)]
    pub data: u64,
    /// The MIG device the event is attributed to, if any (`gpuInstanceId`/`computeInstanceId`;
    /// 0xFFFFFFFF when absent, as nvml.h says for events not tied to one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gi_id: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ci_id: Option<u32>,
}

impl Gpu {
    /// Event types `nvmlDeviceGetSupportedEventTypes` reports: XID on every GPU; ECC errors on
    /// data-centre models (the catalog's), whose memory has ECC. GeForce boards without ECC do
    /// not report the ECC events (inferred from nvml.h: ECC events need ECC-capable memory).
    pub fn supported_event_types(&self) -> u64 {
        match self.catalog_model() {
            Some(_) => XID_CRITICAL | SINGLE_BIT_ECC | DOUBLE_BIT_ECC,
            None => XID_CRITICAL,
        }
    }

    /// The last event's `seq` (0 when none was raised).
    pub fn last_event_seq(&self) -> u64 {
        self.events.last().map_or(0, |e| e.seq)
    }

    /// Raise XID `xid` on this GPU, or on its MIG device (`gi`, `ci`).
    pub fn raise_xid(&mut self, xid: u64, mig_device: Option<(u32, u32)>) -> &mut Self {
        self.raise(XID_CRITICAL, xid, mig_device)
    }

    /// Raise an event of `event_type` (one `nvmlEventType*` bit) with `data`.
    pub fn raise(
        &mut self,
        event_type: u64,
        data: u64,
        mig_device: Option<(u32, u32)>,
    ) -> &mut Self {
        let seq = self.last_event_seq() + 1;
        self.events.push(Event {
            seq,
            event_type,
            data,
            gi_id: mig_device.map(|(gi, _)| gi),
            ci_id: mig_device.map(|(_, ci)| ci),
        });
        self
    }
}

/// What one event set watches: per GPU index, the registered type mask and the `seq` of the
/// last event it delivered (or that was already raised when the GPU was registered).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Watches {
    gpus: BTreeMap<usize, Watch>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Watch {
    mask: u64,
    delivered: u64,
}

impl Watches {
    /// Add `types` for GPU `index`; the first registration starts after the GPU's current
    /// last event, a later one keeps the position and widens the mask.
    pub fn register(&mut self, index: usize, gpu: &Gpu, types: u64) {
        let start = gpu.last_event_seq();
        let w = self.gpus.entry(index).or_insert(Watch {
            mask: 0,
            delivered: start,
        });
        w.mask |= types;
    }

    /// The next undelivered event of a registered type, lowest GPU index first, marked as
    /// delivered. Events of unregistered types are skipped for good, as the driver never queues
    /// them for this set.
    pub fn next(&mut self, gpus: &[Gpu]) -> Option<(usize, Event)> {
        for (&index, w) in &mut self.gpus {
            let Some(gpu) = gpus.get(index) else {
                continue;
            };
            let pending = gpu.events.iter().filter(|e| e.seq > w.delivered);
            if let Some(e) = pending.clone().find(|e| e.event_type & w.mask != 0) {
                w.delivered = e.seq;
                return Some((index, e.clone()));
            }
            w.delivered = w.delivered.max(gpu.last_event_seq());
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_delivers_only_events_raised_after_registration_in_order() {
        let mut gpus = vec![Gpu::mig("h100"), Gpu::mig("h100")];
        gpus[0].raise_xid(79, None);
        let mut set = Watches::default();
        set.register(0, &gpus[0], XID_CRITICAL);
        set.register(1, &gpus[1], XID_CRITICAL);
        assert_eq!(
            set.next(&gpus),
            None,
            "the XID before registration is not delivered"
        );
        gpus[1].raise_xid(48, Some((7, 0)));
        gpus[0].raise(SINGLE_BIT_ECC, 0, None).raise_xid(94, None);
        let (i, e) = set.next(&gpus).unwrap();
        assert_eq!(
            (i, e.data, e.seq),
            (0, 94, 3),
            "the ECC event was not registered"
        );
        let (i, e) = set.next(&gpus).unwrap();
        assert_eq!((i, e.data, e.gi_id, e.ci_id), (1, 48, Some(7), Some(0)));
        assert_eq!(set.next(&gpus), None);
    }
}

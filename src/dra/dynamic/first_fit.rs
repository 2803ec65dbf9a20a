//! The scheduler's side of partitionable devices, as a model to check what gpu-share publishes:
//! kube-scheduler's DRA allocator walks a pool's devices in the order they are listed and takes
//! the first one that matches the request and whose counters are all still free, subtracting
//! what it consumes (KEP-4815, "Putting it all together for the MIG use-case"; it knows nothing
//! of MIG fragmentation). The packing benchmark and the tests allocate through this model; the
//! real scheduler on the test bed is the check that the model is right (docs/dra.md).

use std::collections::BTreeMap;

use crate::dra::api::{Device, ResourceSlice};

/// The devices of a pool with the counters left, as the allocator sees them.
#[derive(Debug, Clone)]
pub struct Pool {
    devices: Vec<Device>,
    allocated: Vec<bool>,
    left: BTreeMap<(String, String), u64>,
}

impl Pool {
    /// The pool `slices` publish: devices in slice order, then listing order.
    pub fn new(slices: &[ResourceSlice]) -> Pool {
        let mut left = BTreeMap::new();
        let mut devices = Vec::new();
        for slice in slices {
            for set in &slice.spec.shared_counters {
                for (name, c) in &set.counters {
                    left.insert((set.name.clone(), name.clone()), parse(&c.value.0));
                }
            }
            devices.extend(slice.spec.devices.iter().cloned());
        }
        let allocated = vec![false; devices.len()];
        Pool {
            devices,
            allocated,
            left,
        }
    }

    /// Allocate the first free device `wanted` accepts whose counters fit; its name, or `None`
    /// when no device fits (the claim stays pending).
    pub fn allocate(&mut self, wanted: impl Fn(&Device) -> bool) -> Option<String> {
        let k = (0..self.devices.len()).find(|&k| {
            !self.allocated[k] && wanted(&self.devices[k]) && self.fits(&self.devices[k])
        })?;
        self.allocated[k] = true;
        for (key, n) in consumption(&self.devices[k]) {
            *self.left.get_mut(&key).expect("fits() checked the counter") -= n;
        }
        Some(self.devices[k].name.clone())
    }

    /// Give device `name` back (its claim was deleted).
    pub fn release(&mut self, name: &str) {
        let Some(k) = self.devices.iter().position(|d| d.name == name) else {
            return;
        };
        if std::mem::take(&mut self.allocated[k]) {
            for (key, n) in consumption(&self.devices[k]) {
                *self.left.entry(key).or_default() += n;
            }
        }
    }

    fn fits(&self, device: &Device) -> bool {
        consumption(device)
            .into_iter()
            .all(|(key, n)| self.left.get(&key).is_some_and(|&left| left >= n))
    }
}

fn consumption(device: &Device) -> Vec<((String, String), u64)> {
    device
        .consumes_counters
        .iter()
        .flat_map(|c| {
            c.counters
                .iter()
                .map(|(name, v)| ((c.counter_set.clone(), name.clone()), parse(&v.value.0)))
        })
        .collect()
}

/// The plain integers gpu-share publishes as counter values.
fn parse(quantity: &str) -> u64 {
    quantity
        .parse()
        .unwrap_or_else(|_| panic!("counter value {quantity:?} is not a plain count"))
}

/// A request for one MIG device of `profile`, as a claim's CEL selector
/// `device.attributes["gpu.gpu-share.dev"].migProfile == "<profile>"` asks.
pub fn mig_profile(profile: &str) -> impl Fn(&Device) -> bool + '_ {
    move |d| {
        d.attributes
            .get("migProfile")
            .and_then(|a| a.string.as_deref())
            == Some(profile)
    }
}

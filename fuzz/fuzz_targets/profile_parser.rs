//! One profile's YAML text: parse it, validate it, and plan a profile that validates on a few
//! simulated nodes. None of it may panic, whatever the input.
#![no_main]

use std::sync::OnceLock;

use gpu_share::plan::{plan, ObservedNode};
use gpu_share::profile::{parse_profile, validate};
use libfuzzer_sys::fuzz_target;

fn nodes() -> &'static [ObservedNode] {
    static NODES: OnceLock<Vec<ObservedNode>> = OnceLock::new();
    NODES.get_or_init(|| {
        ["h100x8", "a100-40gbx8", "NVIDIA GeForce RTX 3090x2"]
            .iter()
            .map(|spec| ObservedNode::simulated(&[spec.to_string()]))
            .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(profile) = parse_profile("fuzz", text) else {
        return;
    };
    if validate("fuzz", &profile).iter().any(|p| p.is_error()) {
        return;
    }
    for node in nodes() {
        let _ = plan("fuzz", &profile, node);
    }
});

//! A file as `gpu-share validate` reads it: one profile, or YAML documents of which the
//! `kind: ConfigMap` ones hold a profile per `data` key. Every profile read is validated. None
//! of it may panic, whatever the input.
#![no_main]

use gpu_share::profile::{read_profiles, validate};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for named in read_profiles("fuzz", text) {
        if let Ok(profile) = named.profile {
            let _ = validate(&named.name, &profile);
        }
    }
});

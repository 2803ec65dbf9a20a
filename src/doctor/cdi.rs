//! CDI specs: the files under /etc/cdi and /var/run/cdi whose `kind` is `nvidia.com/gpu`.

use std::fs;
use std::path::PathBuf;

/// CDI specs for `nvidia.com/gpu`.
#[derive(Debug, Default)]
pub(super) struct Cdi {
    /// `/var/run/cdi/nvidia.yaml (nvidia.com/gpu: 0, 1, all)`.
    pub(super) specs: Vec<String>,
    pub(super) unreadable: Vec<String>,
}

pub(super) fn read_cdi(dirs: &[PathBuf]) -> Cdi {
    let mut out = Cdi::default();
    for dir in dirs {
        let mut files: Vec<PathBuf> = fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.extension()
                    .is_some_and(|x| x == "yaml" || x == "yml" || x == "json")
            })
            .collect();
        files.sort();
        for file in files {
            let spec = fs::read_to_string(&file)
                .map_err(|e| e.to_string())
                .and_then(|t| {
                    serde_yaml::from_str::<serde_yaml::Value>(&t).map_err(|e| e.to_string())
                });
            let spec = match spec {
                Ok(s) => s,
                Err(e) => {
                    out.unreadable
                        .push(format!("CDI spec {} unreadable: {e}", file.display()));
                    continue;
                }
            };
            if spec.get("kind").and_then(serde_yaml::Value::as_str) != Some("nvidia.com/gpu") {
                continue;
            }
            let devices: Vec<&str> = spec
                .get("devices")
                .and_then(serde_yaml::Value::as_sequence)
                .into_iter()
                .flatten()
                .filter_map(|d| d.get("name").and_then(serde_yaml::Value::as_str))
                .collect();
            out.specs.push(format!(
                "{} (nvidia.com/gpu: {})",
                file.display(),
                if devices.is_empty() {
                    "no devices".into()
                } else {
                    devices.join(", ")
                }
            ));
        }
    }
    out
}

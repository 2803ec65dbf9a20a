//! Layer 4, the container runtime: containerd has an NVIDIA runtime (a `runtimes.<name>` whose
//! `options.BinaryName` is nvidia-container-runtime), ideally as its default, and/or CDI specs
//! for `nvidia.com/gpu` exist. The files are read, never guessed at.
//!
//! containerd config versions 1 and 2 (containerd 1.x) put runtimes under
//! `plugins."io.containerd.grpc.v1.cri".containerd.runtimes`, version 3 (containerd 2.x) under
//! `plugins."io.containerd.cri.v1.runtime".containerd.runtimes`: any `containerd.runtimes.<name>`
//! table under `plugins` is taken. `imports` (and `<dir>/conf.d/*.toml`, which `nvidia-ctk`
//! writes to) are read too.

use std::fs;
use std::path::{Path, PathBuf};

use super::{find_program, under, Check, Ctx, Facts};

const NAME: &str = "container-runtime";

/// The one command that sets containerd up for NVIDIA GPUs.
const CONFIGURE: &str = "`sudo nvidia-ctk runtime configure --runtime=containerd && sudo \
     systemctl restart containerd` (from nvidia-container-toolkit)";

/// A runtime found in a containerd config file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Runtime {
    name: String,
    binary: Option<String>,
    file: PathBuf,
}

impl Runtime {
    fn is_nvidia(&self) -> bool {
        self.binary
            .as_deref()
            .is_some_and(|b| b.contains("nvidia-container-runtime"))
    }
}

/// What the containerd config files say.
#[derive(Debug, Default)]
struct Containerd {
    /// Files read, in containerd's order (the main config, then its imports).
    files: Vec<PathBuf>,
    runtimes: Vec<Runtime>,
    /// The last `default_runtime_name` seen, with its file.
    default_runtime: Option<(String, PathBuf)>,
    /// Drop-ins in conf.d that the main config does not import (containerd ignores them).
    not_imported: Vec<PathBuf>,
    /// Files that could not be read or parsed.
    unreadable: Vec<String>,
}

pub(super) fn check(ctx: &Ctx<'_>, _facts: &mut Facts) -> Check {
    let config = &ctx.paths.containerd_config;
    let containerd = read_containerd(&ctx.paths.root, config);
    let cdi = read_cdi(&ctx.paths.cdi_dirs);
    let nvidia: Vec<&Runtime> = containerd
        .runtimes
        .iter()
        .filter(|r| r.is_nvidia())
        .collect();
    let mut found = Vec::new();
    if containerd.files.is_empty() {
        found.push(format!("no containerd config at {}", config.display()));
    } else if nvidia.is_empty() {
        found.push(format!(
            "containerd ({}) has no NVIDIA runtime{}",
            show_files(&containerd.files),
            if containerd.runtimes.is_empty() {
                String::new()
            } else {
                format!(
                    " (runtimes: {})",
                    containerd
                        .runtimes
                        .iter()
                        .map(|r| r.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        ));
    } else {
        let default = containerd.default_runtime.as_ref().map(|(n, _)| n.as_str());
        found.push(format!(
            "containerd runtime{} {}; default runtime: {}",
            if nvidia.len() == 1 { "" } else { "s" },
            nvidia
                .iter()
                .map(|r| format!("{} → {}", r.name, r.binary.as_deref().unwrap_or("?")))
                .collect::<Vec<_>>()
                .join(", "),
            default.unwrap_or("runc (containerd's built-in default)")
        ));
    }
    found.push(if cdi.specs.is_empty() {
        format!(
            "no CDI spec for nvidia.com/gpu in {}",
            show_files(&ctx.paths.cdi_dirs)
        )
    } else {
        format!("CDI: {}", cdi.specs.join("; "))
    });
    let mut check = Check::new(NAME, found.join("; "));
    if containerd.files.is_empty() {
        check.details.push(
            "k3s and RKE2 keep containerd's config in \
             /var/lib/rancher/k3s/agent/etc/containerd/config.toml (or …/rke2/…): point \
             --containerd-config there"
                .into(),
        );
    }
    for u in containerd.unreadable.iter().chain(&cdi.unreadable) {
        check.warn(u.clone(), "correct or remove the file");
    }
    if nvidia.is_empty() {
        judge_no_runtime(&containerd, !cdi.specs.is_empty(), config, &mut check);
        return check;
    }
    for r in &nvidia {
        let binary = Path::new(r.binary.as_deref().unwrap_or_default());
        if find_program(&ctx.paths.root, binary).is_none() {
            check.fail(
                format!(
                    "runtime {:?} ({}) runs {}, which does not exist",
                    r.name,
                    r.file.display(),
                    binary.display()
                ),
                "install nvidia-container-toolkit (it provides nvidia-container-runtime), then \
                 restart containerd",
            );
        }
    }
    let default_is_nvidia = containerd
        .default_runtime
        .as_ref()
        .is_some_and(|(d, _)| nvidia.iter().any(|r| &r.name == d));
    if !default_is_nvidia {
        check.warn(
            "the NVIDIA runtime is not containerd's default: only pods with its \
             runtimeClassName get GPUs (the device plugin's pod too)",
            "make it the default (`sudo nvidia-ctk runtime configure --runtime=containerd \
             --set-as-default && sudo systemctl restart containerd`), or create a RuntimeClass \
             `nvidia` (handler: nvidia) and set runtimeClassName: nvidia on GPU pods",
        );
    }
    check
}

/// No NVIDIA runtime in containerd's config: say why as precisely as the files allow.
fn judge_no_runtime(containerd: &Containerd, has_cdi: bool, config: &Path, check: &mut Check) {
    let nvidia_elsewhere: Vec<&PathBuf> = containerd
        .not_imported
        .iter()
        .filter(|f| fs::read_to_string(f).is_ok_and(|t| t.contains("nvidia-container-runtime")))
        .collect();
    let broken: Vec<&Runtime> = containerd
        .runtimes
        .iter()
        .filter(|r| r.name.contains("nvidia"))
        .collect();
    if !nvidia_elsewhere.is_empty() {
        check.fail(
            format!(
                "the NVIDIA runtime is configured in {}, which {} does not import, so \
                 containerd ignores it",
                show_files(&nvidia_elsewhere),
                config.display()
            ),
            format!(
                "add `imports = [\"/etc/containerd/conf.d/*.toml\"]` at the top of {} and \
                 restart containerd (or rerun {CONFIGURE})",
                config.display()
            ),
        );
    } else if !broken.is_empty() {
        check.fail(
            format!(
                "runtime {:?} ({}) has no options.BinaryName = \"nvidia-container-runtime\": \
                 containerd runs plain runc for it and pods get no GPU",
                broken[0].name,
                broken[0].file.display()
            ),
            format!("rerun {CONFIGURE}"),
        );
    } else if has_cdi {
        check.warn(
            "no NVIDIA runtime in containerd, only CDI specs: GPUs reach containers only if \
             containerd has CDI enabled (enable_cdi = true; the default in containerd 2.x) and \
             the device plugin uses deviceListStrategy cdi-cri",
            format!("configure the runtime as well: {CONFIGURE}"),
        );
    } else {
        check.fail(
            "containers cannot get GPUs: no NVIDIA container runtime and no CDI spec",
            format!(
                "{CONFIGURE}; for CDI also `sudo nvidia-ctk cdi generate \
                 --output=/var/run/cdi/nvidia.yaml`"
            ),
        );
    }
}

fn show_files<P: AsRef<Path>>(files: &[P]) -> String {
    files
        .iter()
        .map(|f| f.as_ref().display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Read the main config, then what it imports, then note conf.d drop-ins it does not import.
fn read_containerd(root: &Path, config: &Path) -> Containerd {
    let mut out = Containerd::default();
    let Ok(text) = fs::read_to_string(config) else {
        out.not_imported = toml_files_in(&config.with_file_name("conf.d"));
        return out;
    };
    let main = match text.parse::<toml::Table>() {
        Ok(t) => t,
        Err(e) => {
            out.unreadable.push(format!(
                "{} is not valid TOML: {}",
                config.display(),
                first_line(&e)
            ));
            return out;
        }
    };
    let imports: Vec<PathBuf> = main
        .get("imports")
        .and_then(toml::Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(toml::Value::as_str)
        .flat_map(|pattern| expand(root, config, pattern))
        .collect();
    out.files.push(config.to_path_buf());
    scan(&main, &[], config, &mut out);
    for file in &imports {
        match fs::read_to_string(file).map(|t| t.parse::<toml::Table>()) {
            Ok(Ok(table)) => {
                out.files.push(file.clone());
                scan(&table, &[], file, &mut out);
            }
            Ok(Err(e)) => out.unreadable.push(format!(
                "{} is not valid TOML: {}",
                file.display(),
                first_line(&e)
            )),
            Err(e) => out
                .unreadable
                .push(format!("cannot read {}: {e}", file.display())),
        }
    }
    out.not_imported = toml_files_in(&config.with_file_name("conf.d"))
        .into_iter()
        .filter(|f| !imports.contains(f))
        .collect();
    out
}

fn first_line(e: &impl std::fmt::Display) -> String {
    e.to_string().lines().next().unwrap_or_default().to_string()
}

/// An `imports` entry: an absolute host path (resolved under `root`) or one relative to the
/// config's directory; `*` in the file name matches like a shell glob.
fn expand(root: &Path, config: &Path, pattern: &str) -> Vec<PathBuf> {
    let p = Path::new(pattern);
    let p = if p.is_absolute() {
        under(root, p)
    } else {
        config.parent().unwrap_or(Path::new(".")).join(p)
    };
    let Some(name) = p.file_name().and_then(|n| n.to_str()) else {
        return Vec::new();
    };
    if !name.contains('*') {
        return vec![p.clone()];
    }
    let dir = p.parent().unwrap_or(Path::new("."));
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|f| {
            f.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| glob(name, n))
        })
        .collect();
    files.sort();
    files
}

/// Shell-style `*` matching (no other wildcards are used in containerd imports).
fn glob(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, rest)) => {
            name.starts_with(head)
                && (0..=name.len() - head.len()).any(|i| {
                    name.is_char_boundary(head.len() + i) && glob(rest, &name[head.len() + i..])
                })
        }
    }
}

fn toml_files_in(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    files
}

/// Walk the tables under `plugins`: `…containerd.runtimes.<name>` are runtimes,
/// `…containerd.default_runtime_name` the default.
fn scan(table: &toml::Table, path: &[&str], file: &Path, out: &mut Containerd) {
    let in_plugins = path.first() == Some(&"plugins");
    if in_plugins && path.last() == Some(&"containerd") {
        if let Some(d) = table
            .get("default_runtime_name")
            .and_then(toml::Value::as_str)
        {
            out.default_runtime = Some((d.to_string(), file.to_path_buf()));
        }
    }
    let n = path.len();
    if in_plugins && n >= 3 && path[n - 2] == "runtimes" && path[n - 3] == "containerd" {
        let binary = table
            .get("options")
            .and_then(toml::Value::as_table)
            .and_then(|o| o.get("BinaryName"))
            .and_then(toml::Value::as_str)
            .map(str::to_string);
        let name = path[n - 1].to_string();
        out.runtimes.retain(|r| r.name != name);
        out.runtimes.push(Runtime {
            name,
            binary,
            file: file.to_path_buf(),
        });
        return;
    }
    for (key, value) in table {
        if let Some(t) = value.as_table() {
            let mut p = path.to_vec();
            p.push(key);
            scan(t, &p, file, out);
        }
    }
}

/// CDI specs for `nvidia.com/gpu`.
#[derive(Debug, Default)]
struct Cdi {
    /// `/var/run/cdi/nvidia.yaml (nvidia.com/gpu: 0, 1, all)`.
    specs: Vec<String>,
    unreadable: Vec<String>,
}

fn read_cdi(dirs: &[PathBuf]) -> Cdi {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_like_a_shell() {
        assert!(glob("*.toml", "99-nvidia.toml"));
        assert!(!glob("*.toml", "99-nvidia.toml.bak"));
        assert!(glob("99-*", "99-nvidia.toml"));
        assert!(glob("a*b*c", "aXbYc"));
        assert!(!glob("a*b*c", "aXbY"));
    }

    #[test]
    fn finds_runtimes_in_v2_and_v3_configs() {
        let v2 = r#"
version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "nvidia"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
    BinaryName = "/usr/bin/nvidia-container-runtime"
"#;
        let v3 = r#"
version = 3
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia-cdi.options]
  BinaryName = "/usr/bin/nvidia-container-runtime.cdi"
"#;
        for (text, name, default) in [(v2, "nvidia", Some("nvidia")), (v3, "nvidia-cdi", None)] {
            let mut out = Containerd::default();
            scan(&text.parse().unwrap(), &[], Path::new("c.toml"), &mut out);
            let nvidia: Vec<_> = out.runtimes.iter().filter(|r| r.is_nvidia()).collect();
            assert_eq!(nvidia.len(), 1, "{out:?}");
            assert_eq!(nvidia[0].name, name);
            assert_eq!(out.default_runtime.map(|d| d.0).as_deref(), default);
        }
    }
}

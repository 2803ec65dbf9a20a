//! containerd's config as files say it: the runtimes under `plugins` and the default runtime,
//! from the main config, the files it imports, and the conf.d drop-ins it does not import.
//!
//! Config versions 1 and 2 (containerd 1.x) put runtimes under
//! `plugins."io.containerd.grpc.v1.cri".containerd.runtimes`, version 3 (containerd 2.x) under
//! `plugins."io.containerd.cri.v1.runtime".containerd.runtimes`: any `containerd.runtimes.<name>`
//! table under `plugins` is taken.

use std::fs;
use std::path::{Path, PathBuf};

use super::under;

/// A runtime found in a containerd config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Runtime {
    pub(super) name: String,
    pub(super) binary: Option<String>,
    pub(super) file: PathBuf,
}

impl Runtime {
    pub(super) fn is_nvidia(&self) -> bool {
        self.binary
            .as_deref()
            .is_some_and(|b| b.contains("nvidia-container-runtime"))
    }
}

/// What the containerd config files say.
#[derive(Debug, Default)]
pub(super) struct Containerd {
    /// Files read, in containerd's order (the main config, then its imports).
    pub(super) files: Vec<PathBuf>,
    pub(super) runtimes: Vec<Runtime>,
    /// The last `default_runtime_name` seen, with its file.
    pub(super) default_runtime: Option<(String, PathBuf)>,
    /// Drop-ins in conf.d that the main config does not import (containerd ignores them).
    pub(super) not_imported: Vec<PathBuf>,
    /// Files that could not be read or parsed.
    pub(super) unreadable: Vec<String>,
}

/// Read the main config, then what it imports, then note conf.d drop-ins it does not import.
pub(super) fn read_containerd(root: &Path, config: &Path) -> Containerd {
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

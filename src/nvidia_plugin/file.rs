//! Writing the plugin's config file and making the plugin reload it.
//!
//! The file is replaced atomically (temp file in the same directory, rename) and only when its
//! bytes change, so an unchanged profile writes nothing and sends no signal. It is not fsynced:
//! it is derived from the node label and written again at every start (see
//! [`crate::atomic_file`] for why a power cut needs no more). The NVIDIA plugin reloads on SIGHUP ("Received SIGHUP, restarting."); we find it
//! through a pid file, or, in a shared process namespace, by its argv[0] as NVIDIA's own
//! config-manager does (nvidia-stack.md §1.6). With the host's PID namespace every pod's
//! processes are visible, another pod's plugin (the GPU Operator's, say) among them, so the
//! agent names its own pod and only a process in that pod's cgroup is signalled.

use std::fs;
use std::path::{Path, PathBuf};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::atomic_file;
use crate::kubelet::cgroup::pod_uid_of;

/// Write the plugin config `text` to `path` unless it already holds exactly that, readable by
/// all (a plugin not running as root reads it); returns whether it wrote. Atomic, not fsynced
/// (module doc).
pub fn write_if_changed(path: &Path, text: &str) -> std::io::Result<bool> {
    atomic_file::replace_derived_if_changed(path, text.as_bytes(), atomic_file::READABLE_BY_ALL)
}

/// Create an empty config at `path` (the NVIDIA plugin's defaults: whole GPUs, no sharing)
/// unless a file is there already; returns whether it created one. The plugin exits at start
/// when its config file is missing, and the agent writes one only once a profile applies; an
/// existing file is the node's last applied config, kept across pod restarts and upgrades.
pub fn create_empty_unless_present(path: &Path) -> std::io::Result<bool> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir)?;
    }
    // create_new: two starts racing never truncate what the other (or the agent) wrote.
    match fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
    {
        Ok(file) => {
            file.sync_all()?;
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
}

/// How to find the device-plugin process to signal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignalTarget {
    /// A file holding its PID.
    PidFile(PathBuf),
    /// Its argv[0] (or that path's file name), searched under a `/proc` (shared process
    /// namespace or hostPID); with `pod_uid`, only among the processes of that pod.
    ProcessName {
        name: String,
        proc_root: PathBuf,
        pod_uid: Option<String>,
    },
}

/// Why a reload signal could not be sent. Messages say their cause; none repeats it as
/// `source()`.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("cannot read the device plugin's pid file {path}: {cause}")]
    PidFile { path: String, cause: std::io::Error },
    #[error("the pid file {path} does not hold a process id")]
    BadPid { path: String },
    #[error("no process named {name:?} under {proc_root}{} (is the device plugin running, and does this pod share its process namespace?)",
            .pod_uid.as_ref().map(|u| format!(" in this pod ({u})")).unwrap_or_default())]
    NotFound {
        name: String,
        proc_root: String,
        pod_uid: Option<String>,
    },
    #[error("cannot signal the device plugin (PID {pid}): {cause}")]
    Signal { pid: i32, cause: nix::Error },
}

/// Send SIGHUP to the device plugin; returns its PID.
pub fn reload(target: &SignalTarget) -> Result<i32, ReloadError> {
    let pid = find(target)?;
    kill(Pid::from_raw(pid), Signal::SIGHUP).map_err(|cause| ReloadError::Signal { pid, cause })?;
    Ok(pid)
}

fn find(target: &SignalTarget) -> Result<i32, ReloadError> {
    match target {
        SignalTarget::PidFile(path) => {
            let text = fs::read_to_string(path).map_err(|cause| ReloadError::PidFile {
                path: path.display().to_string(),
                cause,
            })?;
            text.trim()
                .parse()
                .ok()
                .filter(|p: &i32| *p > 0)
                .ok_or_else(|| ReloadError::BadPid {
                    path: path.display().to_string(),
                })
        }
        SignalTarget::ProcessName {
            name,
            proc_root,
            pod_uid,
        } => {
            find_by_name(name, proc_root, pod_uid.as_deref()).ok_or_else(|| ReloadError::NotFound {
                name: name.clone(),
                proc_root: proc_root.display().to_string(),
                pod_uid: pod_uid.clone(),
            })
        }
    }
}

/// The lowest PID whose argv[0] is `name` or a path ending in `/name`, in pod `pod_uid` when
/// given.
fn find_by_name(name: &str, proc_root: &Path, pod_uid: Option<&str>) -> Option<i32> {
    let mut pids: Vec<i32> = fs::read_dir(proc_root)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    pids.into_iter().find(|pid| {
        let Ok(cmdline) = fs::read(proc_root.join(pid.to_string()).join("cmdline")) else {
            return false;
        };
        let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
        let argv0 = String::from_utf8_lossy(argv0);
        let named = argv0 == name || argv0.rsplit('/').next() == Some(name);
        named
            && pod_uid.is_none_or(|uid| {
                u32::try_from(*pid)
                    .ok()
                    .and_then(|pid| pod_uid_of(proc_root, pid))
                    .is_some_and(|of_pid| of_pid == uid)
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const OURS: &str = "0f6c8b0e-5d1a-4c1e-9a57-2b8e3c9d4f10";
    const THEIRS: &str = "7d1e2f3a-0000-4c1e-9a57-2b8e3c9d4f11";

    /// A `/proc` entry: `pid` running `argv0` in pod `uid` (none: a host process).
    fn process(proc_root: &Path, pid: i32, argv0: &str, uid: Option<&str>) {
        let dir = proc_root.join(pid.to_string());
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("cmdline"), format!("{argv0}\0--flag\0")).unwrap();
        let cgroup = match uid {
            Some(uid) => format!("0::/kubepods/besteffort/pod{uid}/c0ffee\n"),
            None => "0::/system.slice/containerd.service\n".into(),
        };
        fs::write(dir.join("cgroup"), cgroup).unwrap();
    }

    #[test]
    fn an_empty_config_is_created_once_and_an_existing_one_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("device-plugin/config.yaml");
        assert!(create_empty_unless_present(&path).unwrap());
        assert_eq!(fs::read(&path).unwrap(), b"");
        fs::write(&path, "version: v1\n").unwrap();
        assert!(!create_empty_unless_present(&path).unwrap());
        assert_eq!(fs::read_to_string(&path).unwrap(), "version: v1\n");
    }

    #[test]
    fn a_plugin_found_by_name_is_the_one_in_our_pod_when_the_pod_is_named() {
        let proc_root = tempfile::tempdir().unwrap();
        let root = proc_root.path();
        // Lower PIDs first: the GPU Operator's plugin and a host process of the same name.
        process(root, 100, "/usr/bin/nvidia-device-plugin", Some(THEIRS));
        process(root, 150, "nvidia-device-plugin", None);
        process(root, 200, "nvidia-device-plugin", Some(OURS));
        process(root, 300, "sleep", Some(OURS));
        let name = "nvidia-device-plugin";
        assert_eq!(find_by_name(name, root, Some(OURS)), Some(200));
        // Without a pod, the lowest PID of that name, as NVIDIA's config-manager finds it.
        assert_eq!(find_by_name(name, root, None), Some(100));
        assert_eq!(find_by_name("sleep", root, Some(THEIRS)), None);
        let missing = SignalTarget::ProcessName {
            name: name.into(),
            proc_root: root.join("nowhere"),
            pod_uid: Some(OURS.into()),
        };
        let err = find(&missing).unwrap_err().to_string();
        assert!(err.contains(&format!("in this pod ({OURS})")), "{err}");
    }
}

//! Writing the plugin's config file and making the plugin reload it.
//!
//! The file is replaced atomically (temp file in the same directory, fsync, rename, fsync of the
//! directory) and only when its bytes change, so an unchanged profile writes nothing and sends no
//! signal. The NVIDIA plugin reloads on SIGHUP ("Received SIGHUP, restarting."); we find it
//! through a pid file, or, in a shared process namespace, by its argv[0] as NVIDIA's own
//! config-manager does (nvidia-stack.md §1.6).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Write `text` to `path` unless it already holds exactly that. Returns whether it wrote.
pub fn write_if_changed(path: &Path, text: &str) -> std::io::Result<bool> {
    if fs::read(path).is_ok_and(|current| current == text.as_bytes()) {
        return Ok(false);
    }
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs::create_dir_all(dir)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(text.as_bytes())?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    fs::File::open(dir)?.sync_all()?;
    Ok(true)
}

/// How to find the device-plugin process to signal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignalTarget {
    /// A file holding its PID.
    PidFile(PathBuf),
    /// Its argv[0] (or that path's file name), searched under a `/proc` (shared process
    /// namespace or hostPID).
    ProcessName { name: String, proc_root: PathBuf },
}

/// Why a reload signal could not be sent.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("cannot read the device plugin's pid file {path}: {source}")]
    PidFile {
        path: String,
        source: std::io::Error,
    },
    #[error("the pid file {path} does not hold a process id")]
    BadPid { path: String },
    #[error("no process named {name:?} under {proc_root} (is the device plugin running, and does this pod share its process namespace?)")]
    NotFound { name: String, proc_root: String },
    #[error("cannot signal the device plugin (PID {pid}): {source}")]
    Signal { pid: i32, source: nix::Error },
}

/// Send SIGHUP to the device plugin; returns its PID.
pub fn reload(target: &SignalTarget) -> Result<i32, ReloadError> {
    let pid = find(target)?;
    kill(Pid::from_raw(pid), Signal::SIGHUP)
        .map_err(|source| ReloadError::Signal { pid, source })?;
    Ok(pid)
}

fn find(target: &SignalTarget) -> Result<i32, ReloadError> {
    match target {
        SignalTarget::PidFile(path) => {
            let text = fs::read_to_string(path).map_err(|source| ReloadError::PidFile {
                path: path.display().to_string(),
                source,
            })?;
            text.trim()
                .parse()
                .ok()
                .filter(|p: &i32| *p > 0)
                .ok_or_else(|| ReloadError::BadPid {
                    path: path.display().to_string(),
                })
        }
        SignalTarget::ProcessName { name, proc_root } => {
            find_by_name(name, proc_root).ok_or_else(|| ReloadError::NotFound {
                name: name.clone(),
                proc_root: proc_root.display().to_string(),
            })
        }
    }
}

/// The lowest PID whose argv[0] is `name` or a path ending in `/name`.
fn find_by_name(name: &str, proc_root: &Path) -> Option<i32> {
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
        argv0 == name || argv0.rsplit('/').next() == Some(name)
    })
}

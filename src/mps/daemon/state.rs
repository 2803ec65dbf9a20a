//! What a daemon leaves on disk: the applied-settings record (`.gpu-share-mps.json`), the pid
//! file in its pipe directory, and the resource directories under the root; and how a
//! daemon's directory looks now ([`Found`]).

use super::*;

/// What is left of a spec once applied, to compare with the next one.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Applied {
    pub(super) pid: i32,
    pub(super) spec: DaemonSpec,
}

/// How a daemon's directory looks now.
pub(super) enum Found {
    /// Alive and answering, with its answer to the health command.
    Healthy(i32, String),
    /// Alive, but the health command failed.
    Hung(i32, String),
    /// No live daemon; the stale pid if there was one.
    Gone(Option<i32>),
}

/// Resource directories under `root`: those holding a `pipe` directory, `.started` or the
/// applied-settings record, up to four levels down. `shm` at the root (NVIDIA's tmpfs for
/// clients) and hidden entries are skipped; symlinks are not followed.
pub(super) fn discover(root: &Path) -> io::Result<Vec<String>> {
    pub(super) fn walk(
        root: &Path,
        dir: &Path,
        depth: usize,
        found: &mut Vec<String>,
    ) -> io::Result<()> {
        let entries = match fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            if !entry.file_type()?.is_dir() {
                continue;
            }
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') || (depth == 0 && name == SHM_DIR) {
                continue;
            }
            let path = entry.path();
            let is_daemon = path.join("pipe").is_dir()
                || path.join(STARTED).exists()
                || path.join(APPLIED).exists();
            if is_daemon {
                let relative = path.strip_prefix(root).unwrap_or(&path);
                found.push(relative.to_string_lossy().into_owned());
            } else if depth < 3 {
                walk(root, &path, depth + 1, found)?;
            }
        }
        Ok(())
    }
    let mut found = Vec::new();
    walk(root, root, 0, &mut found)?;
    found.sort();
    Ok(found)
}

pub(super) fn remove_file(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Whether a control daemon runs for the pipe directory `pipe_dir`: its pid file names a live
/// process. Cheap enough for the device plugin's health loop: no control command is sent.
pub fn is_running(pipe_dir: &Path) -> bool {
    read_pid(pipe_dir).is_some_and(alive)
}

/// The pid the daemon wrote into its pipe directory.
pub(super) fn read_pid(pipe_dir: &Path) -> Option<i32> {
    fs::read_to_string(pipe_dir.join(PID_FILE))
        .ok()?
        .trim()
        .parse()
        .ok()
        .filter(|p| *p > 0)
}

//! Replacing a file so that a crash or a power cut leaves either the old bytes or the new ones,
//! never a mix: the one way gpu-share writes what must outlive it (the apply journal, the
//! device-plugin config, the state dir's markers, the last advertisement).
//!
//! The recipe is the one `rename(2)` documents and databases use: write a temporary file in the
//! same directory (a rename is atomic only within one file system), `fsync` it, rename it over
//! the target, then `fsync` the directory so the rename itself is on disk. Without the last
//! step a power cut can bring back the old name (ext4 with `data=ordered` orders data before the
//! rename's metadata, not the rename before what follows).
//!
//! A file derived from durable state and written again at every start needs the atomicity,
//! not the durability: [`replace_derived_if_changed`] skips both fsyncs. The device-plugin
//! config is one: the agent writes it from the node label at start, and after a power cut the
//! node reboots, its MIG instances are gone (NVML does not keep them across a reboot), and the
//! agent (or the operator's `gpu-share apply`) applies the profile again before anything reads
//! a config that would matter. A crash of the agent itself still leaves the old bytes or the
//! new: the rename is atomic whether or not it is on disk yet. The fsyncs were 280 µs of the
//! 720 µs from a label's reconcile to the written config (benches/README.md).

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Mode of a file gpu-share writes for others to read: the device-plugin config must be
/// readable by a plugin that does not run as root (NVIDIA's config-manager leaves its files
/// 0644 too), and nothing gpu-share writes is secret.
pub const READABLE_BY_ALL: u32 = 0o644;

/// How far a replacement must survive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Durability {
    /// A power cut: the bytes and the rename are on disk when the call returns.
    Durable,
    /// A crash of the process: the rename is atomic, but may not be on disk yet.
    AtomicOnly,
}

/// Replace `path` with `bytes` atomically and durably (see the module doc), mode `mode`.
/// Creates the parent directory if missing.
pub fn replace(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    replace_as(path, bytes, mode, Durability::Durable)
}

fn replace_as(path: &Path, bytes: &[u8], mode: u32, durability: Durability) -> io::Result<()> {
    let dir = parent(path);
    fs::create_dir_all(dir)?;
    // tempfile creates 0600; the mode is set before the rename so the file is never seen
    // under its name with the wrong one.
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file()
        .set_permissions(fs::Permissions::from_mode(mode))?;
    if durability == Durability::Durable {
        tmp.as_file().sync_all()?;
    }
    tmp.persist(path).map_err(|e| e.error)?;
    match durability {
        Durability::Durable => sync_dir(dir),
        Durability::AtomicOnly => Ok(()),
    }
}

/// [`replace`] unless `path` already holds exactly `bytes` (and has mode `mode`); returns
/// whether it wrote. An unchanged file costs one read and no fsync.
pub fn replace_if_changed(path: &Path, bytes: &[u8], mode: u32) -> io::Result<bool> {
    replace_if_changed_as(path, bytes, mode, Durability::Durable)
}

/// [`replace_if_changed`] for a file derived from durable state and written again at every
/// start: atomic, without the fsyncs (module doc).
pub fn replace_derived_if_changed(path: &Path, bytes: &[u8], mode: u32) -> io::Result<bool> {
    replace_if_changed_as(path, bytes, mode, Durability::AtomicOnly)
}

fn replace_if_changed_as(
    path: &Path,
    bytes: &[u8],
    mode: u32,
    durability: Durability,
) -> io::Result<bool> {
    let same_bytes = fs::read(path).is_ok_and(|current| current == bytes);
    let same_mode = fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o7777 == mode);
    if same_bytes && same_mode {
        return Ok(false);
    }
    replace_as(path, bytes, mode, durability)?;
    Ok(true)
}

/// Remove `path` durably (its directory fsynced); a file already gone is not an error.
pub fn remove(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Ok(()) => sync_dir(parent(path)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

fn parent(path: &Path) -> &Path {
    path.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replace_writes_the_bytes_with_the_mode_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/config.yaml");
        replace(&path, b"version: v1\n", READABLE_BY_ALL).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"version: v1\n");
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o644, "readable by a plugin not running as root");
        let names: Vec<_> = fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["config.yaml"], "no temp file left behind");
    }

    #[test]
    fn replace_if_changed_writes_only_new_bytes_or_a_wrong_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        assert!(replace_if_changed(&path, b"a", 0o644).unwrap());
        assert!(!replace_if_changed(&path, b"a", 0o644).unwrap());
        assert!(replace_if_changed(&path, b"b", 0o644).unwrap());
        // A file an older version created 0600 is rewritten once, to fix its mode.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        assert!(replace_if_changed(&path, b"b", 0o644).unwrap());
        assert!(!replace_if_changed(&path, b"b", 0o644).unwrap());
    }

    /// The derived write keeps everything but the fsyncs: the bytes, the mode set before the
    /// rename, no temp file left, nothing written when unchanged.
    #[test]
    fn a_derived_file_is_replaced_like_any_other_but_for_the_fsyncs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plugin/config.yaml");
        assert!(replace_derived_if_changed(&path, b"sharing: {}\n", READABLE_BY_ALL).unwrap());
        assert_eq!(fs::read(&path).unwrap(), b"sharing: {}\n");
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o644);
        assert!(!replace_derived_if_changed(&path, b"sharing: {}\n", READABLE_BY_ALL).unwrap());
        assert!(replace_derived_if_changed(&path, b"version: v1\n", READABLE_BY_ALL).unwrap());
        let names: Vec<_> = fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["config.yaml"], "no temp file left behind");
    }

    #[test]
    fn remove_of_a_missing_file_is_not_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("marker");
        remove(&path).unwrap();
        replace(&path, b"x", 0o644).unwrap();
        remove(&path).unwrap();
        assert!(!path.exists());
    }
}

//! Replacing a file so that a crash or a power cut leaves either the old bytes or the new ones,
//! never a mix: the one way gpu-share writes what must outlive it (the apply journal, the
//! device-plugin config, the state dir's markers, the last advertisement).
//!
//! The recipe is the one `rename(2)` documents and databases use: write a temporary file in the
//! same directory (a rename is atomic only within one file system), `fsync` it, rename it over
//! the target, then `fsync` the directory so the rename itself is on disk. Without the last
//! step a power cut can bring back the old name (ext4 with `data=ordered` orders data before the
//! rename's metadata, not the rename before what follows).

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Mode of a file gpu-share writes for others to read: the device-plugin config must be
/// readable by a plugin that does not run as root (NVIDIA's config-manager leaves its files
/// 0644 too), and nothing gpu-share writes is secret.
pub const READABLE_BY_ALL: u32 = 0o644;

/// Replace `path` with `bytes` atomically and durably (see the module doc), mode `mode`.
/// Creates the parent directory if missing.
pub fn replace(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let dir = parent(path);
    fs::create_dir_all(dir)?;
    // tempfile creates 0600; the mode is set before the rename so the file is never seen
    // under its name with the wrong one.
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file()
        .set_permissions(fs::Permissions::from_mode(mode))?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    sync_dir(dir)
}

/// [`replace`] unless `path` already holds exactly `bytes` (and has mode `mode`); returns
/// whether it wrote. An unchanged file costs one read and no fsync.
pub fn replace_if_changed(path: &Path, bytes: &[u8], mode: u32) -> io::Result<bool> {
    let same_bytes = fs::read(path).is_ok_and(|current| current == bytes);
    let same_mode = fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o7777 == mode);
    if same_bytes && same_mode {
        return Ok(false);
    }
    replace(path, bytes, mode)?;
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

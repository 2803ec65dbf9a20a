//! The `/dev/shm` that MPS servers and their clients share: a tmpfs at `<mps root>/shm`, as
//! NVIDIA's `mps-control-daemon mount-shm` init container makes it (docs/sources.md#mps).
//! MPS clients talk to their server through `/dev/shm`, so the
//! container running the daemons and every client container must mount this one host
//! directory as their `/dev/shm`; the tmpfs bounds it and keeps it `noexec`.
//!
//! - [`mount_shm`] (`gpu-share mps mount-shm`): mount it, with NVIDIA's options and half the
//!   node's memory as its size; nothing to do when it is a mount point already.
//! - [`mount_point`]: the mount at a path, from `/proc/self/mountinfo`, for the agent's warning
//!   and for `gpu-share doctor --plugin builtin`.

use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::mount::MsFlags;

/// The tmpfs's directory under the MPS root.
pub use super::daemon::SHM_DIR;
/// Its size when `/proc/meminfo` cannot say (what NVIDIA's mount-shm used before it sized by
/// memory).
pub const FALLBACK_SIZE: &str = "65536k";
/// The mount options before `size=`, as NVIDIA's mount-shm gives them to mount(8).
pub const OPTIONS: &str = "rw,nosuid,nodev,noexec,relatime";
/// The mount's source name, as `mount -t tmpfs shm ...` shows it.
const SOURCE: &str = "shm";

/// `<root>/shm`.
pub fn shm_dir(root: &Path) -> PathBuf {
    root.join(SHM_DIR)
}

/// The tmpfs `size=` value for a node with this `/proc/meminfo`: half of `MemTotal`, in kB,
/// rounded up to whole pages of `page_kib` KiB (`4194304k`); `None` when it has no readable
/// `MemTotal`. The kernel sizes a tmpfs in whole pages (mm/shmem.c: `size=` becomes
/// `DIV_ROUND_UP(size, PAGE_SIZE)` blocks, and mountinfo shows the blocks in kB), so rounding
/// here makes the size gpu-share prints the one `/proc/self/mountinfo` and `df` show.
pub fn size_from_meminfo(meminfo: &str, page_kib: u64) -> Option<String> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut words = line["MemTotal:".len()..].split_whitespace();
    let kib: u64 = words.next()?.parse().ok()?;
    // The kernel prints kB (KiB); anything else is not a meminfo we understand.
    if !matches!(words.next(), Some("kB") | None) || kib < 2 {
        return None;
    }
    let page = page_kib.max(1);
    Some(format!("{}k", (kib / 2).div_ceil(page) * page))
}

/// This machine's page size in KiB (4 on x86-64, 4 or 64 on arm64); 4 if it cannot be read.
pub fn page_kib() -> u64 {
    use nix::unistd::{sysconf, SysconfVar};
    match sysconf(SysconfVar::PAGE_SIZE) {
        Ok(Some(bytes)) if bytes >= 1024 => bytes as u64 / 1024,
        _ => 4,
    }
}

/// The whole option string, as `/proc/mounts` or mount(8) would show it.
pub fn options(size: &str) -> String {
    format!("{OPTIONS},size={size}")
}

/// One line of `/proc/<pid>/mountinfo`, the fields gpu-share reads.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MountEntry {
    /// Where it is mounted, relative to the reading process's root.
    pub mount_point: PathBuf,
    pub fs_type: String,
    pub source: String,
    /// Per-mount and filesystem options, joined (`rw,nosuid,...,size=65536k`).
    pub options: String,
}

impl MountEntry {
    pub fn is_tmpfs(&self) -> bool {
        self.fs_type == "tmpfs"
    }
}

/// Every mount of a mountinfo text (proc(5)): `id parent major:minor root mount-point options
/// [optional fields...] - fstype source super-options`. Lines that do not parse are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let fields: Vec<&str> = before.split(' ').collect();
            let mount_point = *fields.get(4)?;
            let mount_options = *fields.get(5)?;
            let mut rest = after.split(' ');
            let fs_type = rest.next()?;
            let source = rest.next().unwrap_or("");
            let super_options = rest.next().unwrap_or("");
            Some(MountEntry {
                mount_point: PathBuf::from(unescape(mount_point)),
                fs_type: unescape(fs_type),
                source: unescape(source),
                options: format!("{mount_options},{super_options}")
                    .trim_end_matches(',')
                    .to_string(),
            })
        })
        .collect()
}

/// mountinfo writes space, tab, newline and backslash as `\040`, `\011`, `\012`, `\134`.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|o| bytes[i] == b'\\' && o.iter().all(|b| (b'0'..=b'7').contains(b)));
        match octal.and_then(|o| u8::from_str_radix(std::str::from_utf8(o).ok()?, 8).ok()) {
            Some(b) => {
                out.push(b);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount whose mount point is `path` in this mountinfo text: the last one listed, which
/// is the one on top when several are stacked there.
pub fn find_mount(mountinfo: &str, path: &Path) -> Option<MountEntry> {
    let canonical = path.canonicalize().ok();
    parse_mountinfo(mountinfo)
        .into_iter()
        .rfind(|m| m.mount_point == path || Some(&m.mount_point) == canonical.as_ref())
}

/// The mount at `path`, from `<proc_root>/self/mountinfo`: `Ok(None)` when `path` is not a
/// mount point (a plain directory, or missing).
pub fn mount_point(proc_root: &Path, path: &Path) -> io::Result<Option<MountEntry>> {
    let text = fs::read_to_string(proc_root.join("self/mountinfo"))?;
    Ok(find_mount(&text, path))
}

/// Why `<root>/shm` could not be mounted.
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    #[error("cannot create {path}: {cause}")]
    CreateDir { path: String, cause: io::Error },
    #[error(
        "cannot read {path} to tell whether {target} is mounted already: {cause} \
         (is /proc mounted? point --proc-root at it)"
    )]
    Mountinfo {
        path: String,
        target: String,
        cause: io::Error,
    },
    #[error("cannot mount a tmpfs at {path} ({options}): {errno}{hint}", hint = hint(*.errno))]
    Mount {
        path: String,
        options: String,
        errno: Errno,
    },
}

fn hint(errno: Errno) -> &'static str {
    match errno {
        Errno::EPERM => {
            "; mounting needs CAP_SYS_ADMIN: run it as root in a privileged init container \
             (securityContext.privileged: true), with the MPS root's hostPath mounted with \
             mountPropagation: Bidirectional so that the host and the other containers see the \
             mount (deploy/overlays/builtin does this)"
        }
        Errno::ENOENT => "; the directory vanished while mounting",
        Errno::ENODEV => "; this kernel has no tmpfs",
        _ => "",
    }
}

/// What [`mount_shm`] did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(
    rename_all = "camelCase",
    rename_all_fields = "camelCase",
    tag = "outcome"
)]
pub enum ShmOutcome {
    /// A new tmpfs is mounted with these options; `sized_by_memory` is false when
    /// `/proc/meminfo` could not be read and [`FALLBACK_SIZE`] was used.
    Mounted {
        path: PathBuf,
        options: String,
        sized_by_memory: bool,
    },
    /// Something is mounted there already; it is left alone.
    AlreadyMounted { path: PathBuf, mount: MountEntry },
}

impl std::fmt::Display for ShmOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShmOutcome::Mounted {
                path,
                options,
                sized_by_memory,
            } => write!(
                f,
                "mounted a tmpfs at {} ({options}){}",
                path.display(),
                if *sized_by_memory {
                    ", half of MemTotal"
                } else {
                    ", the fallback size: MemTotal was not readable"
                }
            ),
            ShmOutcome::AlreadyMounted { path, mount } => write!(
                f,
                "{} is already a mount point ({} {}, {}): nothing to do{}",
                path.display(),
                mount.fs_type,
                mount.source,
                mount.options,
                if mount.is_tmpfs() {
                    ""
                } else {
                    "; it is not a tmpfs, unmount it to have one mounted here"
                }
            ),
        }
    }
}

/// Mount a tmpfs at `<root>/shm` (created if missing) with NVIDIA's options and half the
/// node's memory (`<proc_root>/meminfo`), unless `<root>/shm` is a mount point already
/// (`<proc_root>/self/mountinfo`): then nothing is changed, so a restarted init container never
/// stacks a second tmpfs over the one running MPS clients use.
pub fn mount_shm(root: &Path, proc_root: &Path) -> Result<ShmOutcome, ShmError> {
    let path = shm_dir(root);
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(&path)
        .map_err(|cause| ShmError::CreateDir {
            path: path.display().to_string(),
            cause,
        })?;
    // mountinfo names mount points by their real path.
    let path = path.canonicalize().unwrap_or(path);
    let mountinfo = proc_root.join("self/mountinfo");
    let existing = mount_point(proc_root, &path).map_err(|cause| ShmError::Mountinfo {
        path: mountinfo.display().to_string(),
        target: path.display().to_string(),
        cause,
    })?;
    if let Some(mount) = existing {
        return Ok(ShmOutcome::AlreadyMounted { path, mount });
    }
    let size = fs::read_to_string(proc_root.join("meminfo"))
        .ok()
        .as_deref()
        .and_then(|meminfo| size_from_meminfo(meminfo, page_kib()));
    let sized_by_memory = size.is_some();
    let size = size.unwrap_or_else(|| FALLBACK_SIZE.to_string());
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC | MsFlags::MS_RELATIME;
    let data = format!("size={size}");
    nix::mount::mount(
        Some(SOURCE),
        &path,
        Some("tmpfs"),
        flags,
        Some(data.as_str()),
    )
    .map_err(|errno| ShmError::Mount {
        path: path.display().to_string(),
        options: options(&size),
        errno,
    })?;
    Ok(ShmOutcome::Mounted {
        path,
        options: options(&size),
        sized_by_memory,
    })
}

/// A warning when `<root>/shm` is not the tmpfs MPS needs, for whoever starts MPS daemons;
/// `None` when it is one.
pub fn warning(root: &Path, proc_root: &Path) -> Option<String> {
    let path = shm_dir(root);
    let fix = "`gpu-share mps mount-shm` mounts it (deploy/overlays/builtin runs it as an init \
               container), and the daemons' and the clients' /dev/shm must both be this host \
               directory";
    match mount_point(proc_root, &path) {
        Ok(Some(m)) if m.is_tmpfs() => None,
        Ok(Some(m)) => Some(format!(
            "{} is a {} mount, not a tmpfs: MPS clients and servers share /dev/shm through it; {fix}",
            path.display(),
            m.fs_type
        )),
        Ok(None) => Some(format!(
            "{} is not a mount point: MPS clients and servers share /dev/shm through it, \
             without the tmpfs NVIDIA mounts there (noexec, half the node's memory); {fix}",
            path.display()
        )),
        Err(e) => Some(format!(
            "cannot tell whether {} is a tmpfs mount ({}/self/mountinfo: {e}); {fix}",
            path.display(),
            proc_root.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw
25 22 0:23 / /run rw,nosuid,nodev,noexec,relatime shared:5 - tmpfs tmpfs rw,size=3274040k,mode=755
31 25 0:45 / /run/nvidia/mps/shm rw,nosuid,nodev,noexec,relatime shared:40 - tmpfs shm rw,size=16370200k
40 22 0:50 / /mnt/with\\040space rw,relatime - ext4 /dev/sdb1 rw
41 22 0:51 / /mnt/stacked rw,relatime - ext4 /dev/sdc1 rw
42 41 0:52 / /mnt/stacked rw,relatime master:3 - tmpfs over rw,size=1024k
not a mountinfo line
";

    #[test]
    fn size_is_half_of_mem_total_in_kib() {
        let meminfo = "MemTotal:       32740400 kB\nMemFree:         1000000 kB\n";
        assert_eq!(size_from_meminfo(meminfo, 4).as_deref(), Some("16370200k"));
        assert_eq!(
            size_from_meminfo("MemTotal: 3 kB\n", 1).as_deref(),
            Some("1k")
        );
        assert_eq!(size_from_meminfo("MemFree: 100 kB\n", 4), None);
        assert_eq!(size_from_meminfo("MemTotal: lots kB\n", 4), None);
        assert_eq!(size_from_meminfo("MemTotal: 100 MB\n", 4), None);
        assert_eq!(size_from_meminfo("", 4), None);
    }

    /// The kernel rounds a tmpfs up to whole pages; seen on a CI machine whose half MemTotal,
    /// 12341886 kB, was mounted as `size=12341888k`.
    #[test]
    fn size_is_rounded_up_to_whole_pages_as_the_kernel_mounts_it() {
        let meminfo = "MemTotal:       24683772 kB\n";
        assert_eq!(size_from_meminfo(meminfo, 4).as_deref(), Some("12341888k"));
        assert_eq!(size_from_meminfo(meminfo, 64).as_deref(), Some("12341888k"));
        assert_eq!(
            size_from_meminfo("MemTotal: 24683700 kB\n", 64).as_deref(),
            Some("12341888k")
        );
        assert_eq!(
            size_from_meminfo("MemTotal: 3 kB\n", 4).as_deref(),
            Some("4k")
        );
        assert!(page_kib() >= 4, "page size {} KiB", page_kib());
    }

    #[test]
    fn options_are_nvidias() {
        assert_eq!(
            options(FALLBACK_SIZE),
            "rw,nosuid,nodev,noexec,relatime,size=65536k"
        );
    }

    #[test]
    fn mount_points_come_from_mountinfo() {
        let shm = find_mount(MOUNTINFO, Path::new("/run/nvidia/mps/shm")).unwrap();
        assert!(shm.is_tmpfs());
        assert_eq!(shm.source, "shm");
        assert_eq!(
            shm.options,
            "rw,nosuid,nodev,noexec,relatime,rw,size=16370200k"
        );
        // A directory inside a mount is not a mount point.
        assert_eq!(find_mount(MOUNTINFO, Path::new("/run/nvidia/mps")), None);
        assert_eq!(
            find_mount(MOUNTINFO, Path::new("/run/nvidia/mps/shm/x")),
            None
        );
        // Escaped names, and the top one of stacked mounts.
        let spaced = find_mount(MOUNTINFO, Path::new("/mnt/with space")).unwrap();
        assert_eq!(spaced.fs_type, "ext4");
        let top = find_mount(MOUNTINFO, Path::new("/mnt/stacked")).unwrap();
        assert_eq!(
            (top.fs_type.as_str(), top.source.as_str()),
            ("tmpfs", "over")
        );
        assert_eq!(parse_mountinfo(MOUNTINFO).len(), 6);
    }

    #[test]
    fn unescapes_octal_only() {
        assert_eq!(unescape(r"a\040b\011c\134d"), "a b\tc\\d");
        assert_eq!(unescape(r"a\9b\04"), r"a\9b\04");
    }

    #[test]
    fn already_mounted_is_left_alone_and_a_warning_says_what_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("mps");
        let proc = dir.path().join("proc");
        fs::create_dir_all(proc.join("self")).unwrap();
        let shm = shm_dir(&root);
        let line = |fs: &str| {
            format!(
                "31 25 0:45 / {} rw,nosuid,nodev,noexec,relatime - {fs} shm rw,size=65536k\n",
                shm.display()
            )
        };
        fs::write(proc.join("self/mountinfo"), line("tmpfs")).unwrap();
        // Nothing mounted, nothing to mount: the fixture says it is there already.
        match mount_shm(&root, &proc).unwrap() {
            ShmOutcome::AlreadyMounted { path, mount } => {
                assert_eq!(path, shm.canonicalize().unwrap());
                assert!(mount.is_tmpfs());
            }
            other => panic!("{other:?}"),
        }
        assert!(shm.is_dir(), "the directory is created");
        assert_eq!(warning(&root, &proc), None);

        fs::write(proc.join("self/mountinfo"), line("ext4")).unwrap();
        let w = warning(&root, &proc).unwrap();
        assert!(w.contains("ext4 mount, not a tmpfs"), "{w}");
        let said = mount_shm(&root, &proc).unwrap().to_string();
        assert!(said.contains("nothing to do; it is not a tmpfs"), "{said}");

        fs::write(proc.join("self/mountinfo"), "").unwrap();
        let w = warning(&root, &proc).unwrap();
        assert!(w.contains("is not a mount point"), "{w}");
        assert!(w.contains("gpu-share mps mount-shm"), "{w}");

        fs::remove_file(proc.join("self/mountinfo")).unwrap();
        assert!(warning(&root, &proc).unwrap().contains("cannot tell"));
        let e = mount_shm(&root, &proc).unwrap_err().to_string();
        assert!(
            e.contains("self/mountinfo") && e.contains("--proc-root"),
            "{e}"
        );
    }

    #[test]
    fn mount_errors_name_the_path_and_what_is_missing() {
        let e = ShmError::Mount {
            path: "/run/nvidia/mps/shm".into(),
            options: options(FALLBACK_SIZE),
            errno: Errno::EPERM,
        }
        .to_string();
        assert!(e.contains("/run/nvidia/mps/shm"), "{e}");
        assert!(e.contains("EPERM"), "{e}");
        assert!(
            e.contains("CAP_SYS_ADMIN") && e.contains("privileged"),
            "{e}"
        );
        assert!(e.contains("Bidirectional"), "{e}");
        let e = ShmError::Mount {
            path: "/x".into(),
            options: String::new(),
            errno: Errno::EBUSY,
        }
        .to_string();
        assert!(!e.contains("CAP_SYS_ADMIN"), "{e}");
    }
}

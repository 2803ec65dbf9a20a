//! `gpu-share mps mount-shm` for real: each run is inside `unshare --mount` (a private mount
//! namespace, so no tmpfs outlives the test), which needs root. Where the build found that
//! refused (build.rs: `no_mount_namespace`) these tests are reported as ignored, with the
//! reason; the pure parts (size, options, mountinfo) are unit tests in src/mps/shm.rs.

use std::path::Path;
use std::process::{Command, Output};

/// `script` run by sh in a new mount namespace, with `$B` the gpu-share binary.
fn in_namespace(script: &str) -> Output {
    Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", script])
        .env("B", env!("CARGO_BIN_EXE_gpu-share"))
        .env_remove("GPU_SHARE_MPS_ROOT")
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The size of the filesystem at `path` in kB, as df says, and its line in mountinfo.
const INSPECT: &str =
    r#"df -k --output=size "$ROOT/shm" | tail -n 1; grep " $ROOT/shm " /proc/self/mountinfo"#;

#[test]
#[cfg_attr(
    no_mount_namespace,
    ignore = "unshare --mount is refused here (needs root): the real tmpfs mount is not exercised"
)]
fn mounts_nvidias_tmpfs_once_sized_by_memory() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("mps");
    let out = in_namespace(&format!(
        r#"set -e; ROOT={root}; "$B" mps mount-shm --mps-root "$ROOT"; "$B" mps mount-shm --mps-root "$ROOT"; {INSPECT}"#,
        root = root.display()
    ));
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    let shm = root.join("shm");
    assert_eq!(
        lines[0],
        format!(
            "mounted a tmpfs at {} (rw,nosuid,nodev,noexec,relatime,size={}), half of MemTotal",
            shm.display(),
            expected_size()
        ),
        "{}",
        text(&out)
    );
    assert!(
        lines[1].starts_with(&format!(
            "{} is already a mount point (tmpfs shm",
            shm.display()
        )),
        "{}",
        text(&out)
    );
    assert!(lines[1].ends_with("nothing to do"), "{}", text(&out));
    assert_eq!(
        format!("{}k", lines[2].trim()),
        expected_size(),
        "{}",
        text(&out)
    );
    assert!(
        lines[3].contains(" rw,nosuid,nodev,noexec,relatime ")
            && lines[3].contains(" - tmpfs shm "),
        "{}",
        text(&out)
    );
    assert_eq!(lines.len(), 4, "one tmpfs, not two: {}", text(&out));
    // Nothing left mounted outside the namespace.
    let host = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!host.contains(&shm.display().to_string()));
}

fn expected_size() -> String {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    format!("{}k", as_the_kernel_mounts(kib / 2))
}

/// The size in KiB the kernel gives a tmpfs asked for `kib`: whole pages, rounded up
/// (mm/shmem.c, shmem_parse_one: DIV_ROUND_UP(size, PAGE_SIZE)); mountinfo and df show it.
/// The page size is `getconf PAGESIZE`, read apart from gpu-share's own reading of it.
fn as_the_kernel_mounts(kib: u64) -> u64 {
    let out = Command::new("getconf")
        .arg("PAGESIZE")
        .output()
        .expect("getconf PAGESIZE");
    let page_bytes: u64 = String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let page_kib = page_bytes / 1024;
    kib.div_ceil(page_kib) * page_kib
}

/// `mps mount-shm` once in a mount namespace with a `/proc` of the real `self/` (mountinfo)
/// and `meminfo` as given (none: no meminfo), then [`INSPECT`]: its output and its lines.
fn mount_with_meminfo(meminfo: Option<&str>) -> (Output, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("mps");
    let proc = dir.path().join("proc");
    std::fs::create_dir(&proc).unwrap();
    std::os::unix::fs::symlink("/proc/self", proc.join("self")).unwrap();
    if let Some(meminfo) = meminfo {
        std::fs::write(proc.join("meminfo"), meminfo).unwrap();
    }
    let out = in_namespace(&format!(
        r#"set -e; ROOT={root}; "$B" mps mount-shm --mps-root "$ROOT" --proc-root {proc}; {INSPECT}"#,
        root = root.display(),
        proc = proc.display()
    ));
    assert!(out.status.success(), "{}", text(&out));
    let lines = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    (out, lines)
}

#[test]
#[cfg_attr(
    no_mount_namespace,
    ignore = "unshare --mount is refused here (needs root): the real tmpfs mount is not exercised"
)]
fn without_meminfo_the_size_is_nvidias_fallback() {
    let (out, lines) = mount_with_meminfo(None);
    assert!(
        lines[0].ends_with("size=65536k), the fallback size: MemTotal was not readable"),
        "{}",
        text(&out)
    );
    assert_eq!(lines[1].trim(), "65536", "{}", text(&out));
}

/// A node whose half MemTotal is not a whole number of pages (the CI machine that showed it:
/// MemTotal 24683772 kB, half 12341886 kB, mounted by the kernel as 12341888k): the size
/// gpu-share prints is the one the kernel mounted.
#[test]
#[cfg_attr(
    no_mount_namespace,
    ignore = "unshare --mount is refused here (needs root): the real tmpfs mount is not exercised"
)]
fn the_printed_size_is_the_one_the_kernel_mounts_when_half_of_memory_is_not_whole_pages() {
    let (out, lines) = mount_with_meminfo(Some("MemTotal:       24683772 kB\n"));
    let mounted = as_the_kernel_mounts(12_341_886);
    assert!(
        lines[0].ends_with(&format!("size={mounted}k), half of MemTotal")),
        "{}",
        text(&out)
    );
    assert_eq!(lines[1].trim(), mounted.to_string(), "{}", text(&out));
    assert!(
        lines[2].ends_with(&format!(" rw,size={mounted}k")),
        "{}",
        text(&out)
    );
}

#[test]
#[cfg_attr(
    no_mount_namespace,
    ignore = "unshare --mount is refused here (needs root): the real tmpfs mount is not exercised"
)]
fn without_cap_sys_admin_the_error_names_the_path_and_the_capability() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("mps");
    let out = in_namespace(&format!(
        r#"exec setpriv --inh-caps=-sys_admin --bounding-set=-sys_admin "$B" mps mount-shm --mps-root {}"#,
        root.display()
    ));
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("setpriv"),
        "setpriv (util-linux) must be able to drop CAP_SYS_ADMIN for this test: {}",
        text(&out)
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let shm = root.join("shm");
    assert!(
        stderr.contains(&format!("cannot mount a tmpfs at {}", shm.display())),
        "{}",
        text(&out)
    );
    assert!(stderr.contains("EPERM"), "{}", text(&out));
    assert!(
        stderr.contains("CAP_SYS_ADMIN") && stderr.contains("privileged init container"),
        "{}",
        text(&out)
    );
    assert!(shm.is_dir(), "the directory is made before mounting");
}

#[test]
fn a_root_that_cannot_be_created_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, "").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-share"))
        .args(["mps", "mount-shm", "--mps-root"])
        .arg(&file)
        .env_remove("GPU_SHARE_MPS_ROOT")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "cannot create {}",
            Path::new(&file).join("shm").display()
        )),
        "{}",
        text(&out)
    );
}

#[test]
#[cfg_attr(
    no_mount_namespace,
    ignore = "unshare --mount is refused here (needs root): the real tmpfs mount is not exercised"
)]
fn says_what_it_did_as_json_for_scripts() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("mps");
    let out = in_namespace(&format!(
        r#"set -e; "$B" mps mount-shm --mps-root {root} -o json; echo ---; "$B" mps mount-shm --mps-root {root} -o json"#,
        root = root.display()
    ));
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    let (first, second) = stdout.split_once("---").unwrap();
    let first: serde_json::Value = serde_json::from_str(first).unwrap();
    let second: serde_json::Value = serde_json::from_str(second).unwrap();
    assert_eq!(first["outcome"], "mounted", "{}", text(&out));
    assert_eq!(first["sizedByMemory"], true, "{}", text(&out));
    assert_eq!(second["outcome"], "alreadyMounted", "{}", text(&out));
    assert_eq!(second["mount"]["fsType"], "tmpfs", "{}", text(&out));
}

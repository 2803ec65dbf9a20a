//! The fake as a black box: `-d`, the client, the commands, recording and fault injection.
//! (Also what makes `cargo test --workspace` build `target/<profile>/nvidia-cuda-mps-control`,
//! which gpu-share's own tests/mps_daemon.rs runs.)

use std::fs;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_nvidia-cuda-mps-control");

/// A scratch directory, removed on drop (after quitting any daemon left in it).
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "fake-mps-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
    fn pipe(&self) -> PathBuf {
        self.0.join("pipe")
    }
    fn log(&self) -> PathBuf {
        self.0.join("log")
    }
    fn record(&self) -> PathBuf {
        self.0.join("record")
    }
    fn cmd(&self) -> Command {
        let mut c = Command::new(BIN);
        c.env("CUDA_MPS_PIPE_DIRECTORY", self.pipe())
            .env("CUDA_MPS_LOG_DIRECTORY", self.log())
            .env("FAKE_MPS_RECORD", self.record())
            .env("CUDA_VISIBLE_DEVICES", "GPU-aaaa,GPU-bbbb")
            .env_remove("FAKE_MPS_DIE_AFTER");
        c
    }
    fn start(&self) -> Output {
        self.cmd().arg("-d").stdin(Stdio::null()).output().unwrap()
    }
    fn send(&self, input: &str) -> Output {
        let mut child = self
            .cmd()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Without a daemon the client exits before reading its input.
        let _ = child.stdin.take().unwrap().write_all(input.as_bytes());
        child.wait_with_output().unwrap()
    }
    fn pid(&self) -> Option<u32> {
        fs::read_to_string(self.pipe().join("nvidia-cuda-mps-control.pid"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    }
    fn recorded(&self) -> Vec<String> {
        fs::read_to_string(self.record())
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = self.send("quit\n");
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Alive and not a zombie (the detached daemon's parent is whoever adopts orphans).
fn alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

fn wait_gone(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(pid) {
        assert!(Instant::now() < deadline, "pid {pid} still alive");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn daemon_answers_and_quits() {
    let s = Scratch::new();
    let out = s.start();
    assert!(out.status.success(), "{out:?}");
    let pid = s.pid().expect("pid file");
    assert!(alive(pid));
    assert!(s.log().join("control.log").exists());

    let out = s.send("get_default_active_thread_percentage\n");
    assert!(out.status.success());
    assert_eq!(text(&out), "100.0\n");

    // Several commands in one client run, the last without a newline (as NVIDIA's plugin sends).
    let out = s.send(
        "set_default_active_thread_percentage 25\nset_default_device_pinned_mem_limit 1 512M\n\
         get_default_device_pinned_mem_limit GPU-bbbb\nget_default_active_thread_percentage",
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(text(&out), "512M\n25.0\n");
    assert_eq!(text(&s.send("get_server_list\n")), "");

    let out = s.send("quit\n");
    assert!(out.status.success());
    wait_gone(pid);
    assert!(s.pid().is_none(), "quit removes the pid file");
    assert_eq!(
        s.recorded(),
        [
            "get_default_active_thread_percentage",
            "set_default_active_thread_percentage 25",
            "set_default_device_pinned_mem_limit 1 512M",
            "get_default_device_pinned_mem_limit GPU-bbbb",
            "get_default_active_thread_percentage",
            "get_server_list",
            "quit",
        ]
    );
    let log = fs::read_to_string(s.log().join("control.log")).unwrap();
    assert!(
        log.contains("Starting control daemon using socket"),
        "{log}"
    );
}

#[test]
fn refusals() {
    let s = Scratch::new();
    let out = s.send("get_server_list\n");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out), "Cannot find MPS control daemon process\n");

    assert!(s.start().status.success());
    let out = s.start();
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("An instance of this daemon is already running"));

    for bad in [
        "set_default_device_pinned_mem_limit 0 10GB",
        "set_default_device_pinned_mem_limit 0 1024",
        "set_default_device_pinned_mem_limit 2 1G", // only two devices visible
        "set_default_active_thread_percentage 0",
        "set_default_active_thread_percentage lots",
        "frobnicate",
    ] {
        let out = s.send(&format!("{bad}\n"));
        assert_eq!(out.status.code(), Some(1), "{bad}: {out:?}");
        assert!(!text(&out).is_empty(), "{bad}: an error answer");
    }
    // Refused commands change nothing.
    assert_eq!(
        text(&s.send("get_default_device_pinned_mem_limit 0\n")),
        "0\n"
    );
}

#[test]
fn die_after_leaves_stale_files_and_a_new_daemon_takes_over() {
    let s = Scratch::new();
    let out = s
        .cmd()
        .arg("-d")
        .env("FAKE_MPS_DIE_AFTER", "2")
        .output()
        .unwrap();
    assert!(out.status.success());
    let pid = s.pid().unwrap();
    assert!(s.send("get_server_list\n").status.success());
    // The second command is answered, then the daemon is gone without cleaning up.
    assert!(s.send("get_server_list\n").status.success());
    wait_gone(pid);
    assert_eq!(s.pid(), Some(pid), "a crash leaves the pid file");
    assert!(s.pipe().join("control").exists());
    assert_eq!(s.send("get_server_list\n").status.code(), Some(1));

    assert!(s.start().status.success(), "a new daemon reclaims the dir");
    let pid2 = s.pid().unwrap();
    assert_ne!(pid, pid2);
    assert_eq!(
        text(&s.send("get_default_active_thread_percentage\n")),
        "100.0\n"
    );
}

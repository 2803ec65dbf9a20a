//! `gpu-share apply` / `status` as processes on one simulated node.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use nvidia_ml::{cdylib_path, Gpu, LogEntry, State};

use crate::{
    assert_no_orphans, gpu_share_bin, h100s, mps_control, observe, pending_steps, profile_path,
    repo, successful_mutations, text,
};

/// One simulated node for the CLI: a fake-NVML state file, its mutation log, gpu-share's state
/// dir and MPS root, all in one temp dir. MPS daemons it started die with it.
pub struct CliNode {
    pub dir: tempfile::TempDir,
    /// The fake NVML's state file (`FAKE_NVML_STATE`).
    pub state: PathBuf,
    /// The fake NVML's call log (`FAKE_NVML_LOG`).
    pub log: PathBuf,
    /// `GPU_SHARE_STATE_DIR` (not created until gpu-share writes its journal).
    pub state_dir: PathBuf,
}

impl CliNode {
    pub fn new(gpus: Vec<Gpu>) -> CliNode {
        Self::with_state(State::with_gpus(gpus))
    }

    pub fn with_state(state: State) -> CliNode {
        let dir = tempfile::tempdir().unwrap();
        let node = CliNode {
            state: dir.path().join("nvml-state.json"),
            log: dir.path().join("nvml.log"),
            state_dir: dir.path().join("gpu-share"),
            dir,
        };
        state.write_to(&node.state).unwrap();
        node
    }

    /// `GPU_SHARE_MPS_ROOT`.
    pub fn mps_root(&self) -> PathBuf {
        self.dir.path().join("mps")
    }

    /// `gpu-share <args>` in the repository, on this node, with `env` set last.
    pub fn gpu_share(&self, args: &[&str], env: &[(&str, String)]) -> Output {
        self.command(args, env).output().expect("run gpu-share")
    }

    /// The `gpu-share` command [`Self::gpu_share`] runs, for a caller that runs it otherwise.
    pub fn command(&self, args: &[&str], env: &[(&str, String)]) -> Command {
        let mut cmd = Command::new(gpu_share_bin());
        cmd.args(args)
            .current_dir(repo())
            .env("GPU_SHARE_NVML_LIB", cdylib_path())
            .env("GPU_SHARE_STATE_DIR", &self.state_dir)
            .env("FAKE_NVML_STATE", &self.state)
            .env("FAKE_NVML_LOG", &self.log)
            .env("GPU_SHARE_MPS_ROOT", self.mps_root())
            .env("RUST_LOG", "warn");
        if let Some(mps) = mps_control() {
            cmd.env("GPU_SHARE_MPS_CONTROL", mps);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd
    }

    /// `apply --profile profiles/<name>.yaml`.
    pub fn apply(&self, name: &str) -> Output {
        self.gpu_share(&["apply", "--profile", &profile_path(name)], &[])
    }

    /// [`Self::apply`], which must succeed; its stdout.
    pub fn apply_ok(&self, name: &str) -> String {
        let out = self.apply(name);
        assert!(out.status.success(), "apply {name}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn fake_state(&self) -> State {
        State::read_from(&self.state).unwrap()
    }

    pub fn set_fake_state(&self, state: &State) {
        state.write_to(&self.state).unwrap();
    }

    /// Successful mutations the fake logged so far.
    pub fn mutations(&self) -> Vec<LogEntry> {
        successful_mutations(&self.log)
    }

    /// Successful calls of one NVML function so far.
    pub fn count(&self, function: &str) -> usize {
        self.mutations()
            .iter()
            .filter(|e| e.function == function)
            .count()
    }

    pub fn journal(&self) -> PathBuf {
        self.state_dir.join("apply-journal.json")
    }

    /// Panics unless the node matches profile `name` with nothing orphaned.
    pub fn assert_matches(&self, name: &str, what: &str) {
        assert_no_orphans(&self.fake_state(), what);
        let left = pending_steps(name, &observe(&self.state));
        assert!(left.is_empty(), "{what}: {name} still needs {left:?}");
    }
}

/// Crash `apply` (the fake NVML calls `abort()`) right before each mutation of the transition
/// `from → to` (example profiles) on `gpus` H100s, then `apply --resume`: every run must
/// converge on `to` with nothing orphaned and no journal left, and pass `resumed` (the node, the
/// resume's output, what is being checked). Returns the number of crash points.
pub fn crash_at_every_mutation(
    from: &str,
    to: &str,
    gpus: usize,
    resumed: impl Fn(&CliNode, &Output, &str),
) -> usize {
    let what = format!("{from} → {to} on {gpus} GPUs");
    let clean = CliNode::new(h100s(gpus, true));
    clean.apply_ok(from);
    let start = clean.fake_state();
    let before = clean.mutations().len();
    clean.apply_ok(to);
    let total = clean.mutations().len() - before;
    clean.assert_matches(to, &what);

    for k in 1..=total {
        let what = format!("{what}, crash before mutation {k}/{total}");
        let node = CliNode::with_state(start.clone());
        let out = node.gpu_share(
            &["apply", "--profile", &profile_path(to)],
            &[("FAKE_NVML_ABORT_AT_MUTATION", k.to_string())],
        );
        assert!(!out.status.success(), "{what}: the run should have aborted");
        assert_eq!(
            node.mutations().len(),
            k - 1,
            "{what}: mutations persisted before the abort"
        );
        assert!(node.journal().exists(), "{what}: no journal left");
        let out = node.gpu_share(&["apply", "--resume"], &[]);
        assert!(out.status.success(), "{what}: resume: {}", text(&out));
        node.assert_matches(to, &what);
        resumed(&node, &out, &what);
        assert!(!node.journal().exists(), "{what}: journal not removed");
    }
    total
}

impl Drop for CliNode {
    fn drop(&mut self) {
        kill_mps_daemons(&self.mps_root());
    }
}

/// MPS daemons a node started die with it (a failed assertion must not leak processes).
pub fn kill_mps_daemons(root: &Path) {
    for pid_file in mps_pid_files(root) {
        if let Some(pid) = read_pid(&pid_file) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

pub fn read_pid(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Every `nvidia-cuda-mps-control.pid` below `dir`: one per running MPS daemon.
pub fn mps_pid_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .flat_map(|e| {
            let p = e.path();
            if p.is_dir() {
                mps_pid_files(&p)
            } else if p
                .file_name()
                .is_some_and(|n| n == "nvidia-cuda-mps-control.pid")
            {
                vec![p]
            } else {
                Vec::new()
            }
        })
        .collect()
}

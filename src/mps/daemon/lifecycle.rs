//! One daemon's life: find it, check its health, start it with its settings, restart it when
//! it crashed, hangs or has other settings, and stop it when no longer wanted.

use super::*;

/// The daemon of one resource.
pub(super) struct Daemon<'a> {
    settings: &'a MpsSettings,
    resource: &'a str,
    dir: PathBuf,
    pipe: PathBuf,
    log: PathBuf,
}

impl<'a> Daemon<'a> {
    pub(super) fn new(settings: &'a MpsSettings, resource: &'a str) -> Self {
        Daemon {
            settings,
            resource,
            dir: settings.root.join(resource),
            pipe: settings.pipe_dir(resource),
            log: settings.log_dir(resource),
        }
    }

    pub(super) fn io_error(&self, action: &'static str, path: &Path, cause: io::Error) -> MpsError {
        MpsError::Io {
            resource: self.resource.to_string(),
            pipe_dir: self.pipe.clone(),
            action,
            path: path.to_path_buf(),
            cause,
        }
    }

    pub(super) fn command_error(&self, command: &str, detail: impl Into<String>) -> MpsError {
        MpsError::Command {
            resource: self.resource.to_string(),
            pipe_dir: self.pipe.clone(),
            command: command.to_string(),
            detail: detail.into(),
        }
    }

    /// Bring this daemon to `spec`.
    pub(super) fn ensure(
        &self,
        spec: &DaemonSpec,
        ready: &mut Readiness,
    ) -> Result<Outcome, MpsError> {
        let applied = self.applied();
        let reason = match self.find()? {
            Found::Healthy(pid, answer) => {
                let Some(reason) = self.differs(pid, &answer, applied.as_ref(), spec) else {
                    let started = self.dir.join(STARTED);
                    if !started.exists() {
                        fs::write(&started, b"")
                            .map_err(|e| self.io_error("write", &started, e))?;
                    }
                    return Ok(Outcome::Unchanged);
                };
                ready.changing();
                info!(resource = self.resource, pid, %reason, "restarting the MPS control daemon");
                self.stop(pid)?;
                reason
            }
            Found::Hung(pid, detail) => {
                ready.changing();
                warn!(resource = self.resource, pid, %detail, "the MPS control daemon does not answer; killing it");
                self.terminate(pid, "kill")?;
                format!("the daemon (pid {pid}) did not answer `{HEALTH_COMMAND}`: {detail}")
            }
            Found::Gone(pid) => {
                ready.changing();
                let had_one = pid.is_some() || applied.is_some() || self.dir.join(STARTED).exists();
                if !had_one {
                    self.start(spec)?;
                    return Ok(Outcome::Started);
                }
                let reason = match pid {
                    Some(pid) => format!("the daemon (pid {pid}) is not running"),
                    None => "the daemon is not running (no pid file)".to_string(),
                };
                warn!(resource = self.resource, %reason, "restarting the MPS control daemon");
                reason
            }
        };
        self.start(spec)?;
        Ok(Outcome::Restarted(reason))
    }

    /// Why the running daemon `pid` does not match `spec`, if it doesn't.
    pub(super) fn differs(
        &self,
        pid: i32,
        answer: &str,
        applied: Option<&Applied>,
        spec: &DaemonSpec,
    ) -> Option<String> {
        let Some(applied) = applied else {
            return Some(format!(
                "a daemon (pid {pid}) runs without a record of its settings"
            ));
        };
        if applied.pid != pid {
            return Some(format!(
                "the daemon (pid {pid}) is not the one configured (pid {})",
                applied.pid
            ));
        }
        if applied.spec != *spec {
            return Some(describe_change(&applied.spec, spec));
        }
        let want = f64::from(spec.active_thread_percentage.unwrap_or(100));
        match answer.trim().parse::<f64>() {
            Ok(have) if (have - want).abs() > 0.05 => Some(format!(
                "its default active thread percentage is {have}, not {want}"
            )),
            _ => None,
        }
    }

    /// Stop the daemon, if any, and remove its directory. True if there was something to stop.
    pub(super) fn remove(&self, ready: &mut Readiness) -> Result<bool, MpsError> {
        let found = self.find()?;
        let marked = self.dir.join(STARTED).exists() || self.dir.join(APPLIED).exists();
        if matches!(found, Found::Gone(None)) && !marked && !self.pipe.exists() {
            return Ok(false);
        }
        ready.changing();
        match found {
            Found::Healthy(pid, _) => self.stop(pid)?,
            Found::Hung(pid, _) => self.terminate(pid, "kill")?,
            Found::Gone(_) => {}
        }
        for file in [STARTED, APPLIED] {
            let path = self.dir.join(file);
            remove_file(&path).map_err(|e| self.io_error("remove", &path, e))?;
        }
        for dir in [&self.log, &self.pipe] {
            match fs::remove_dir_all(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(self.io_error("remove", dir, e)),
            }
        }
        // The resource's directory and its now-empty parents up to the root (nvidia.com/).
        let mut dir = self.dir.as_path();
        while dir != self.settings.root && fs::remove_dir(dir).is_ok() {
            match dir.parent() {
                Some(parent) => dir = parent,
                None => break,
            }
        }
        info!(
            resource = self.resource,
            "MPS control daemon stopped and removed"
        );
        Ok(!matches!(found, Found::Gone(None)) || marked)
    }

    /// The daemon's state; an error only when the control binary cannot be run at all.
    pub(super) fn find(&self) -> Result<Found, MpsError> {
        let Some(pid) = self.pid() else {
            return Ok(Found::Gone(None));
        };
        if !alive(pid) || !self.is_control_daemon(pid) {
            return Ok(Found::Gone(Some(pid)));
        }
        match self.client(HEALTH_COMMAND) {
            Ok(run) if run.success => Ok(Found::Healthy(pid, run.stdout)),
            Ok(run) => Ok(Found::Hung(pid, run.describe())),
            Err(RunError::Timeout(detail)) => Ok(Found::Hung(pid, detail)),
            // Not the daemon's fault: leave it alone.
            Err(RunError::Spawn(detail)) => Err(self.command_error(HEALTH_COMMAND, detail)),
        }
    }

    pub(super) fn pid(&self) -> Option<i32> {
        read_pid(&self.pipe)
    }

    /// Whether `pid` still runs the control binary (and not another process that got its pid
    /// after a crash): `/proc/<pid>/comm` is the binary's name, cut to 15 bytes. True where
    /// `/proc` cannot tell.
    pub(super) fn is_control_daemon(&self, pid: i32) -> bool {
        let Ok(comm) = fs::read_to_string(format!("/proc/{pid}/comm")) else {
            return true;
        };
        let Some(name) = self.settings.control_binary.file_name() else {
            return true;
        };
        let name = name.to_string_lossy();
        let short: String = name.chars().take(15).collect();
        let is = comm.trim_end() == short;
        if !is {
            warn!(
                resource = self.resource,
                pid,
                comm = comm.trim_end(),
                "the pid file names another process; treating the daemon as gone"
            );
        }
        is
    }

    pub(super) fn applied(&self) -> Option<Applied> {
        let path = self.dir.join(APPLIED);
        let text = fs::read_to_string(&path).ok()?;
        match serde_json::from_str(&text) {
            Ok(a) => Some(a),
            Err(e) => {
                warn!(path = %path.display(), error = %e, "unreadable record of MPS settings; the daemon will be restarted");
                None
            }
        }
    }

    /// Start a daemon (none runs), give it `spec`'s settings, and mark it started.
    pub(super) fn start(&self, spec: &DaemonSpec) -> Result<(), MpsError> {
        for dir in [&self.pipe, &self.log] {
            fs::create_dir_all(dir).map_err(|e| self.io_error("create", dir, e))?;
        }
        // No daemon runs: whatever it left in its pipe directory is stale. The directory itself
        // stays, as running pods may have it mounted.
        let entries = fs::read_dir(&self.pipe).map_err(|e| self.io_error("list", &self.pipe, e))?;
        for entry in entries.flatten() {
            let path = entry.path();
            let removed = if entry.file_type().is_ok_and(|t| t.is_dir()) {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
            removed.map_err(|e| self.io_error("remove", &path, e))?;
        }
        for file in [STARTED, APPLIED] {
            let path = self.dir.join(file);
            remove_file(&path).map_err(|e| self.io_error("remove", &path, e))?;
        }

        let (visible, by_index) = spec.visible_devices();
        if by_index {
            warn!(resource = self.resource, devices = %visible, "GPU UUIDs unknown; the MPS daemon gets NVML indices with CUDA_DEVICE_ORDER=PCI_BUS_ID");
        }
        let start_command = format!("{} -d", self.settings.control_binary.display());
        let mut command = Command::new(&self.settings.control_binary);
        command
            .arg("-d")
            .env("CUDA_MPS_PIPE_DIRECTORY", &self.pipe)
            .env("CUDA_MPS_LOG_DIRECTORY", &self.log)
            .env("CUDA_VISIBLE_DEVICES", &visible);
        if by_index {
            command.env("CUDA_DEVICE_ORDER", "PCI_BUS_ID");
        }
        let run = run(command, None, self.settings.timeout)
            .map_err(|e| self.command_error(&start_command, e.to_string()))?;
        if !run.success {
            return Err(self.command_error(&start_command, run.describe()));
        }
        let pid = self.wait_for_pid().ok_or_else(|| {
            self.command_error(
                &start_command,
                format!(
                    "no live daemon wrote {} within {:?}{}",
                    self.pipe.join(PID_FILE).display(),
                    self.settings.timeout,
                    run.output_suffix()
                ),
            )
        })?;
        info!(resource = self.resource, pid, devices = %visible, "MPS control daemon started");

        if let Err(e) = self.configure(spec, pid) {
            // Clients must not find a daemon without its limits.
            if alive(pid) {
                let _ = self.stop(pid);
            }
            return Err(e);
        }
        let applied = serde_json::to_string_pretty(&Applied {
            pid,
            spec: spec.clone(),
        })
        .expect("the applied spec serializes");
        let path = self.dir.join(APPLIED);
        fs::write(&path, applied).map_err(|e| self.io_error("write", &path, e))?;
        let path = self.dir.join(STARTED);
        fs::write(&path, b"").map_err(|e| self.io_error("write", &path, e))?;
        Ok(())
    }

    /// Send the spec's settings, then read the thread percentage back.
    pub(super) fn configure(&self, spec: &DaemonSpec, pid: i32) -> Result<(), MpsError> {
        let mut commands = spec.commands();
        commands.push(HEALTH_COMMAND.to_string());
        for (i, command) in commands.iter().enumerate() {
            // `-d` may return before the daemon listens: the first command may wait for it.
            let answer = if i == 0 {
                self.send_when_up(command, pid)?
            } else {
                self.send(command)?
            };
            if command == HEALTH_COMMAND {
                let want = f64::from(spec.active_thread_percentage.unwrap_or(100));
                if let Ok(have) = answer.trim().parse::<f64>() {
                    if (have - want).abs() > 0.05 {
                        return Err(self.command_error(
                            command,
                            format!("the daemon reports {have}, but {want} was set"),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    pub(super) fn send_when_up(&self, command: &str, pid: i32) -> Result<String, MpsError> {
        let deadline = Instant::now() + self.settings.timeout;
        loop {
            match self.send(command) {
                Err(MpsError::Command { ref detail, .. })
                    if detail.contains(NO_DAEMON) && alive(pid) && Instant::now() < deadline =>
                {
                    thread::sleep(POLL);
                }
                other => return other,
            }
        }
    }

    pub(super) fn wait_for_pid(&self) -> Option<i32> {
        let deadline = Instant::now() + self.settings.timeout;
        loop {
            if let Some(pid) = self.pid().filter(|p| alive(*p)) {
                return Some(pid);
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(POLL);
        }
    }

    /// `echo COMMAND | nvidia-cuda-mps-control`: its output, or why it failed.
    pub(super) fn send(&self, command: &str) -> Result<String, MpsError> {
        let run = self
            .client(command)
            .map_err(|e| self.command_error(command, e.to_string()))?;
        if run.success {
            Ok(run.stdout)
        } else {
            Err(self.command_error(command, run.describe()))
        }
    }

    pub(super) fn client(&self, command: &str) -> Result<Run, RunError> {
        debug!(resource = self.resource, command, "MPS control command");
        let mut client = Command::new(&self.settings.control_binary);
        client
            .env("CUDA_MPS_PIPE_DIRECTORY", &self.pipe)
            .env("CUDA_MPS_LOG_DIRECTORY", &self.log);
        run(client, Some(command), self.settings.timeout)
    }

    /// `quit`, and wait for the daemon to exit; signals if it doesn't.
    pub(super) fn stop(&self, pid: i32) -> Result<(), MpsError> {
        match self.send("quit") {
            Ok(_) => {
                if wait_exit(pid, self.settings.timeout) {
                    info!(resource = self.resource, pid, "MPS control daemon quit");
                    return Ok(());
                }
                warn!(resource = self.resource, pid, timeout = ?self.settings.timeout, "the MPS control daemon did not exit after quit");
            }
            Err(e) => warn!(resource = self.resource, pid, error = %e, "quit failed"),
        }
        self.terminate(pid, "quit")
    }

    /// SIGTERM, then SIGKILL, each with the timeout to exit.
    pub(super) fn terminate(&self, pid: i32, command: &str) -> Result<(), MpsError> {
        for signal in [Signal::SIGTERM, Signal::SIGKILL] {
            match kill(Pid::from_raw(pid), signal) {
                Ok(()) => {}
                Err(Errno::ESRCH) => return Ok(()),
                Err(e) => {
                    return Err(self.command_error(
                        command,
                        format!("the daemon (pid {pid}) cannot be sent {signal}: {e}"),
                    ))
                }
            }
            warn!(resource = self.resource, pid, %signal, "signalled the MPS control daemon");
            if wait_exit(pid, self.settings.timeout) {
                return Ok(());
            }
        }
        Err(self.command_error(
            command,
            format!("the daemon (pid {pid}) is still running after SIGKILL"),
        ))
    }
}

//! Processes: whether a pid is a live (not zombie) process, waiting for one to exit, and
//! running the control binary with a timeout.

use super::*;

/// Alive: `kill(pid, 0)` finds it and it is not a zombie (a daemon that crashed after its
/// parent, `-d`, exited is a child of whoever adopts orphans, who may never reap it).
pub(super) fn alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    match kill(Pid::from_raw(pid), None) {
        Ok(()) | Err(Errno::EPERM) => !is_zombie(pid),
        Err(_) => false,
    }
}

pub(super) fn is_zombie(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

pub(super) fn wait_exit(pid: i32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while alive(pid) {
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(POLL);
    }
    true
}

/// A finished run of the control binary.
pub(super) struct Run {
    pub(super) success: bool,
    pub(super) status: String,
    pub(super) stdout: String,
    pub(super) stderr: String,
}

impl Run {
    pub(super) fn output(&self) -> String {
        let mut text = self.stdout.trim().to_string();
        let err = self.stderr.trim();
        if !err.is_empty() {
            if !text.is_empty() {
                text.push_str(" / ");
            }
            text.push_str(err);
        }
        text
    }

    pub(super) fn output_suffix(&self) -> String {
        match self.output() {
            t if t.is_empty() => String::new(),
            t => format!(" (it printed: {t})"),
        }
    }

    pub(super) fn describe(&self) -> String {
        match self.output() {
            t if t.is_empty() => self.status.clone(),
            t => format!("{}: {t}", self.status),
        }
    }
}

/// Why the control binary gave no exit status.
#[derive(Debug)]
pub(super) enum RunError {
    /// It could not be started.
    Spawn(String),
    /// It was killed after the timeout.
    Timeout(String),
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Spawn(d) | RunError::Timeout(d) => f.write_str(d),
        }
    }
}

/// Run `command` with `input` on stdin (closed right after), killing it after `timeout`.
/// Output goes to unnamed temp files rather than pipes: a daemon forked by `-d` may keep its
/// parent's stdout open, and a pipe would then never reach EOF.
pub(super) fn run(
    mut command: Command,
    input: Option<&str>,
    timeout: Duration,
) -> Result<Run, RunError> {
    let program = command.get_program().to_string_lossy().into_owned();
    let spawn_error = |e: io::Error| RunError::Spawn(format!("cannot run {program}: {e}"));
    let mut stdout = tempfile::tempfile().map_err(spawn_error)?;
    let mut stderr = tempfile::tempfile().map_err(spawn_error)?;
    let mut child = command
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(stdout.try_clone().map_err(spawn_error)?)
        .stderr(stderr.try_clone().map_err(spawn_error)?)
        .spawn()
        .map_err(spawn_error)?;
    if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
        // A client that died at once closes the pipe; its exit status says why.
        let _ = stdin.write_all(input.as_bytes());
        let _ = stdin.write_all(b"\n");
    }
    let status = match wait_child(&mut child, timeout) {
        Ok(Some(status)) => status,
        Ok(None) | Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(RunError::Timeout(format!(
                "no answer within {timeout:?}; killed {program}"
            )));
        }
    };
    Ok(Run {
        success: status.success(),
        status: status.to_string(),
        stdout: read_all(&mut stdout),
        stderr: read_all(&mut stderr),
    })
}

pub(super) fn read_all(file: &mut fs::File) -> String {
    let mut bytes = Vec::new();
    let _ = file
        .seek(SeekFrom::Start(0))
        .and_then(|_| file.read_to_end(&mut bytes));
    String::from_utf8_lossy(&bytes).into_owned()
}

pub(super) fn wait_child(
    child: &mut Child,
    timeout: Duration,
) -> io::Result<Option<std::process::ExitStatus>> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        thread::sleep(Duration::from_millis(5));
    }
}

//! A fake `nvidia-cuda-mps-control`: the CUDA MPS control daemon (`-d`, `-f`) and its client (no
//! arguments, commands on stdin), for gpu-share's tests. No GPU, no MPS server: it keeps the
//! daemon's defaults, answers the control commands gpu-share sends, and records them.
//!
//! What follows the real binary and what is the fake's own is listed, with sources, in README.md.
//! The client/daemon transport (a Unix socket named `control` in the pipe directory, with the
//! framing below) is the fake's own: the real one is private to NVIDIA.
//!
//! Framing: the client sends one command per line; the daemon answers each with a header line
//! `OK <len>` or `ERR <len>` followed by `<len>` bytes of text, which the client prints.

use std::collections::BTreeMap;
use std::env;
use std::fs::{self, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{self, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const PID_FILE: &str = "nvidia-cuda-mps-control.pid";
const SOCKET: &str = "control";
const LOG_FILE: &str = "control.log";
const DEFAULT_PIPE_DIR: &str = "/tmp/nvidia-mps";
const DEFAULT_LOG_DIR: &str = "/var/log/nvidia-mps";
const NO_DAEMON: &str = "Cannot find MPS control daemon process";
const ALREADY_RUNNING: &str = "An instance of this daemon is already running";
/// Set by `-d` for the detached daemon it starts: announce readiness on stdout, then stay quiet.
const DETACHED_ENV: &str = "FAKE_MPS_DETACHED";
/// What the detached daemon prints once it listens; `-d` returns 0 when it reads it.
const READY_LINE: &str = "fake-mps-control: listening";

fn main() {
    let args: Vec<String> = env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let code = match args.as_slice() {
        [] => client(),
        ["-d"] => daemonize(),
        ["-f"] => daemon(env::var_os(DETACHED_ENV).is_some()),
        ["-v"] => {
            println!(
                "CUDA MPS Control (fake-mps-control {})",
                env!("CARGO_PKG_VERSION")
            );
            0
        }
        _ => {
            eprintln!("Usage: nvidia-cuda-mps-control [-d | -f | -v]");
            2
        }
    };
    process::exit(code);
}

fn pipe_dir() -> PathBuf {
    env::var_os("CUDA_MPS_PIPE_DIRECTORY")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_PIPE_DIR), PathBuf::from)
}

fn log_dir() -> PathBuf {
    env::var_os("CUDA_MPS_LOG_DIRECTORY")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_LOG_DIR), PathBuf::from)
}

// ---------------------------------------------------------------------------------------------
// Client

/// Send each stdin line to the daemon and print its answer. Exit 1 when no daemon answers or
/// any command is refused.
fn client() -> i32 {
    let socket = pipe_dir().join(SOCKET);
    let stream = match UnixStream::connect(&socket) {
        Ok(s) => s,
        Err(_) => {
            println!("{NO_DAEMON}");
            return 1;
        }
    };
    let mut writer = match stream.try_clone() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("nvidia-cuda-mps-control: {e}");
            return 1;
        }
    };
    let mut reader = BufReader::new(stream);
    let mut status = 0;
    for line in io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let command = line.trim();
        if command.is_empty() {
            continue;
        }
        if writeln!(writer, "{command}").is_err() {
            println!("{NO_DAEMON}");
            return 1;
        }
        match read_answer(&mut reader) {
            Some((ok, text)) => {
                if !text.is_empty() {
                    print!("{text}");
                    if !text.ends_with('\n') {
                        println!();
                    }
                }
                if !ok {
                    status = 1;
                }
            }
            None => {
                // The daemon went away mid-conversation (crash or quit by someone else).
                println!("{NO_DAEMON}");
                return 1;
            }
        }
        if command == "quit" {
            break;
        }
    }
    status
}

fn read_answer(reader: &mut impl BufRead) -> Option<(bool, String)> {
    let mut header = String::new();
    if reader.read_line(&mut header).ok()? == 0 {
        return None;
    }
    let (kind, len) = header.trim_end().split_once(' ')?;
    let len: usize = len.parse().ok()?;
    let mut body = vec![0; len];
    reader.read_exact(&mut body).ok()?;
    Some((kind == "OK", String::from_utf8_lossy(&body).into_owned()))
}

// ---------------------------------------------------------------------------------------------
// -d: start the daemon in the background

/// Re-run this binary as a detached foreground daemon (own process group, stdin/stderr closed,
/// cwd `/`), wait until it listens (or fails), and return. The daemon outlives this process.
fn daemonize() -> i32 {
    let exe = match env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("nvidia-cuda-mps-control: cannot find own executable: {e}");
            return 1;
        }
    };
    let mut child = match Command::new(exe)
        .arg("-f")
        .env(DETACHED_ENV, "1")
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("nvidia-cuda-mps-control: cannot start the daemon: {e}");
            return 1;
        }
    };
    let out = BufReader::new(child.stdout.take().expect("piped stdout"));
    for line in out.lines() {
        let Ok(line) = line else { break };
        if line == READY_LINE {
            return 0;
        }
        println!("{line}");
    }
    // The daemon closed its stdout without announcing itself: it refused or failed to start.
    match child.wait() {
        Ok(s) => s.code().filter(|c| *c != 0).unwrap_or(1),
        Err(_) => 1,
    }
}

// ---------------------------------------------------------------------------------------------
// -f: the daemon itself

struct Daemon {
    pipe_dir: PathBuf,
    log: PathBuf,
    socket: PathBuf,
    pid_file: PathBuf,
    /// Write log lines to stdout too (`-f` run by hand); the detached daemon only logs to file.
    console: bool,
    record: Option<PathBuf>,
    die_after: Option<u64>,
    commands: u64,
    visible: Vec<String>,
    active_thread_percentage: f64,
    pinned: BTreeMap<String, String>,
}

fn daemon(detached: bool) -> i32 {
    let pipe_dir = pipe_dir();
    let log_dir = log_dir();
    for dir in [&pipe_dir, &log_dir] {
        if let Err(e) = fs::create_dir_all(dir) {
            println!("Cannot create directory {}: {e}", dir.display());
            return 1;
        }
    }
    let socket = pipe_dir.join(SOCKET);
    // A daemon that answers on this pipe directory already owns it.
    if UnixStream::connect(&socket).is_ok() {
        println!("{ALREADY_RUNNING}");
        return 1;
    }
    // Nobody answers: whatever is left there is stale (a crashed daemon's socket).
    let _ = fs::remove_file(&socket);
    let listener = match UnixListener::bind(&socket) {
        Ok(l) => l,
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
            println!("{ALREADY_RUNNING}");
            return 1;
        }
        Err(e) => {
            println!("Cannot create socket {}: {e}", socket.display());
            return 1;
        }
    };
    let pid_file = pipe_dir.join(PID_FILE);
    if let Err(e) = fs::write(&pid_file, format!("{}\n", process::id())) {
        println!("Cannot write {}: {e}", pid_file.display());
        let _ = fs::remove_file(&socket);
        return 1;
    }
    let mut d = Daemon {
        log: log_dir.join(LOG_FILE),
        pipe_dir,
        socket,
        pid_file,
        console: !detached,
        record: env::var_os("FAKE_MPS_RECORD")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from),
        die_after: env::var("FAKE_MPS_DIE_AFTER")
            .ok()
            .and_then(|v| v.trim().parse().ok()),
        commands: 0,
        visible: env::var("CUDA_VISIBLE_DEVICES")
            .ok()
            .filter(|v| !v.trim().is_empty())
            .map(|v| v.split(',').map(|s| s.trim().to_string()).collect())
            .unwrap_or_default(),
        active_thread_percentage: 100.0,
        pinned: BTreeMap::new(),
    };
    d.log(&format!(
        "Starting control daemon using socket {}",
        d.socket.display()
    ));
    d.log(&format!(
        "To connect CUDA applications to this daemon, set env CUDA_MPS_PIPE_DIRECTORY={}",
        d.pipe_dir.display()
    ));
    d.log(&format!(
        "CUDA_VISIBLE_DEVICES={}",
        env::var("CUDA_VISIBLE_DEVICES").unwrap_or_default()
    ));
    if detached {
        println!("{READY_LINE}");
        let _ = io::stdout().flush();
    }
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        d.log("Accepting connection...");
        if d.serve(conn) == Flow::Quit {
            d.log("Exiting (quit)");
            let _ = fs::remove_file(&d.pid_file);
            let _ = fs::remove_file(&d.socket);
            return 0;
        }
    }
    0
}

#[derive(PartialEq)]
enum Flow {
    Continue,
    Quit,
}

impl Daemon {
    fn log(&self, message: &str) {
        let line = format!("[{} Control {}] {message}\n", timestamp(), process::id());
        if self.console {
            print!("{line}");
        }
        append(&self.log, &line);
    }

    fn record(&self, command: &str) {
        match &self.record {
            Some(path) => append(path, &format!("{command}\n")),
            None => self.log(&format!("Cmd:{command}")),
        }
    }

    /// One client connection: answer its commands until it hangs up, or `quit`.
    fn serve(&mut self, conn: UnixStream) -> Flow {
        let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
        let Ok(mut writer) = conn.try_clone() else {
            return Flow::Continue;
        };
        let reader = BufReader::new(conn);
        for line in reader.lines() {
            let Ok(line) = line else { break };
            let command = line.trim();
            if command.is_empty() {
                continue;
            }
            self.record(command);
            self.commands += 1;
            let quit = command == "quit";
            let (ok, text) = if quit {
                (true, String::new())
            } else {
                match self.execute(command) {
                    Ok(t) => (true, t),
                    Err(t) => (false, t),
                }
            };
            let header = if ok { "OK" } else { "ERR" };
            let _ = write!(writer, "{header} {}\n{text}", text.len());
            let _ = writer.flush();
            if self.die_after.is_some_and(|n| self.commands >= n) {
                // A crash: no clean-up, the pid file and socket stay behind.
                process::exit(1);
            }
            if quit {
                return Flow::Quit;
            }
        }
        Flow::Continue
    }

    fn execute(&mut self, command: &str) -> Result<String, String> {
        let words: Vec<&str> = command.split_whitespace().collect();
        match words.as_slice() {
            ["get_server_list"] => Ok(String::new()),
            ["get_default_active_thread_percentage"] => {
                Ok(format!("{:.1}\n", self.active_thread_percentage))
            }
            ["set_default_active_thread_percentage", p] => {
                let p: f64 = p
                    .parse()
                    .ok()
                    .filter(|p: &f64| *p > 0.0 && *p <= 100.0)
                    .ok_or_else(|| format!("Invalid active thread percentage {p}\n"))?;
                self.active_thread_percentage = p;
                Ok(String::new())
            }
            ["set_default_device_pinned_mem_limit", dev, value] => {
                let dev = self.device(dev)?;
                if !valid_limit(value) {
                    return Err(format!(
                        "Invalid memory limit {value}: expected an integer followed by G or M\n"
                    ));
                }
                self.pinned.insert(dev, value.to_string());
                Ok(String::new())
            }
            ["get_default_device_pinned_mem_limit", dev] => {
                let dev = self.device(dev)?;
                Ok(format!(
                    "{}\n",
                    self.pinned.get(&dev).map_or("0", String::as_str)
                ))
            }
            [name, ..] if KNOWN.contains(name) => Err(format!(
                "{name}: not simulated by fake-mps-control, or wrong arguments\n"
            )),
            _ => Err(format!("Unrecognized command: {command}\n")),
        }
    }

    /// A device as the daemon sees it: an index into its CUDA_VISIBLE_DEVICES (every index when
    /// that is unset), or one of the UUIDs listed there. Stored by index.
    fn device(&self, dev: &str) -> Result<String, String> {
        if let Ok(i) = dev.parse::<usize>() {
            if self.visible.is_empty() || i < self.visible.len() {
                return Ok(i.to_string());
            }
        } else if let Some(i) = self.visible.iter().position(|v| v == dev) {
            return Ok(i.to_string());
        }
        Err(format!("Invalid device {dev}\n"))
    }
}

/// Control commands of the real daemon's (legacy v2) interface that the fake knows by name but
/// does not simulate.
const KNOWN: &[&str] = &[
    "get_server_list",
    "get_server_status",
    "start_server",
    "get_client_list",
    "get_device_client_list",
    "set_default_active_thread_percentage",
    "get_default_active_thread_percentage",
    "set_active_thread_percentage",
    "get_active_thread_percentage",
    "set_default_device_pinned_mem_limit",
    "get_default_device_pinned_mem_limit",
    "set_device_pinned_mem_limit",
    "get_device_pinned_mem_limit",
    "quit",
];

/// `<integer>M` or `<integer>G`, as the MPS docs define the value.
fn valid_limit(value: &str) -> bool {
    match value.strip_suffix(['M', 'G']) {
        Some(n) => !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()),
        None => false,
    }
}

fn append(path: &Path, text: &str) {
    if let Ok(mut f) = OpenOptions::new().create(true).append(true).open(path) {
        let _ = f.write_all(text.as_bytes());
    }
}

/// `2024-06-10 15:16:40.777` (UTC), the real control.log's timestamp shape.
fn timestamp() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs();
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let s = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:03}",
        s / 3600,
        s / 60 % 60,
        s % 60,
        now.subsec_millis()
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits() {
        assert!(valid_limit("8192M"));
        assert!(valid_limit("10G"));
        assert!(!valid_limit("10GB"));
        assert!(!valid_limit("M"));
        assert!(!valid_limit("10"));
        assert!(!valid_limit("-1M"));
        assert!(!valid_limit("1.5G"));
    }

    #[test]
    fn dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
    }
}

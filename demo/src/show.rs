//! How the story is printed: a live progress line on a terminal, plain lines otherwise (a pipe,
//! a log, the demo's test).

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

pub struct Show {
    tty: bool,
    started: Instant,
}

impl Show {
    pub fn new() -> Show {
        Show {
            tty: std::io::stdout().is_terminal(),
            started: Instant::now(),
        }
    }

    /// A chapter title.
    pub fn chapter(&self, n: usize, title: &str) {
        self.clear();
        println!(
            "\n== {n}. {title}  [t={:.1}s]",
            self.started.elapsed().as_secs_f64()
        );
    }

    /// One line of the story.
    pub fn line(&self, text: &str) {
        self.clear();
        println!("   {text}");
    }

    /// A progress line while waiting; redrawn in place on a terminal, not printed otherwise
    /// (the plain output keeps only the lines that say what happened).
    pub fn progress(&self, waited: Duration, text: &str) {
        if self.tty {
            const SPIN: [char; 4] = ['|', '/', '-', '\\'];
            let frame = SPIN[(waited.as_millis() / 120) as usize % SPIN.len()];
            print!("\r\x1b[2K   {frame} {text} ({:.1}s)", waited.as_secs_f64());
            let _ = std::io::stdout().flush();
        }
    }

    fn clear(&self) {
        if self.tty {
            print!("\r\x1b[2K");
        }
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}

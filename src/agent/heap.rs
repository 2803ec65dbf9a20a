//! Giving the heap memory the agent has freed back to the kernel when it goes idle.
//!
//! NVML, file and process work runs on tokio's blocking-pool threads, and under glibc each such
//! thread allocates from its own malloc arena. When the thread ends (10 s after its last task,
//! i.e. once the agent is idle), glibc keeps the arena, and the pages of everything freed in it
//! stay resident: trimming gave 0.7 MiB of RssAnon back (2.5 -> 1.8 MiB idle, measured when it
//! was added; benches/README.md, "Agent memory", has the step and today's figure).
//! `malloc_trim(0)` returns every whole free
//! page of every arena; it runs as each blocking thread ends, so never on the async thread and
//! never while a reconcile is working.

/// Return the freed pages of every malloc arena to the kernel (glibc only; a no-op elsewhere).
pub fn return_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim has no preconditions; it takes each arena's lock while it trims.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::return_freed_heap;

    fn rss_anon_kb() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("RssAnon:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }

    /// A thread fills its arena with 32 MiB of blocks below glibc's mmap threshold (128 KiB),
    /// frees them except the last (which pins the arena's top, so glibc's automatic trim of
    /// the top cannot return the rest), and ends: the freed pages stay resident until
    /// [`return_freed_heap`] gives them back.
    #[test]
    fn freed_memory_of_an_ended_thread_is_given_back() {
        let kept = std::thread::spawn(|| {
            let mut blocks: Vec<Vec<u8>> = (0..512).map(|_| vec![1u8; 64 * 1024]).collect();
            let last = blocks.pop().unwrap();
            drop(blocks);
            last
        })
        .join()
        .unwrap();
        let before = rss_anon_kb();
        return_freed_heap();
        let after = rss_anon_kb();
        assert!(
            before >= after + 16 * 1024,
            "RssAnon {before} kB before malloc_trim, {after} kB after: under 16 MiB given back"
        );
        drop(kept);
    }
}

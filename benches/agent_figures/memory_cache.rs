//! The page cache's copy of the agent binary, for the memory figures' "cold" column.
//!
//! The bench runs a binary cargo has just written, so the whole file sits in the page cache,
//! and each page fault in its code maps up to 16 neighbouring cached pages as well (the
//! kernel's fault-around, `fault_around_bytes`, 64 KiB by default): the resident figure then
//! counts pages the agent never touched. On a node the image's binary is cached only as far as
//! the agent (and the kernel's readahead for it) read it. Dropping the binary's cached pages
//! before the agent starts reproduces that; the agent itself is not changed or advised in any
//! way, so the figure is what `ps` or the kubelet sees for a normal run.
//!
//! `posix_fadvise(POSIX_FADV_DONTNEED)` drops clean, unmapped pages only, so the file is
//! synced first (a just-linked binary can still have dirty pages) and no agent may be running
//! from it; [`cached_pages`] (`mincore`) checks what is left, and the bench prints it.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

/// Drop `path`'s pages from the page cache; returns the (cached, total) pages left after.
pub fn drop_from_page_cache(path: &Path) -> io::Result<(usize, usize)> {
    let file = File::open(path)?;
    file.sync_all()?;
    // SAFETY: a plain syscall on an open descriptor; offset 0 and length 0 mean the whole file.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    cached_pages(path)
}

/// Read all of `path`, so the page cache holds it whole; returns the (cached, total) pages
/// after (a file larger than free memory may not stay whole).
pub fn read_into_page_cache(path: &Path) -> io::Result<(usize, usize)> {
    std::io::copy(&mut File::open(path)?, &mut std::io::sink())?;
    cached_pages(path)
}

/// How many of `path`'s pages are in the page cache, and how many it has (`mincore` on a
/// private read-only mapping of the file; mapping it faults nothing in).
pub fn cached_pages(path: &Path) -> io::Result<(usize, usize)> {
    let file = File::open(path)?;
    let len = file.metadata()?.len() as usize;
    if len == 0 {
        return Ok((0, 0));
    }
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let pages = len.div_ceil(page);
    // SAFETY: a new read-only mapping of an open file, unmapped below; nothing reads through it.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            file.as_raw_fd(),
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let mut residency = vec![0u8; pages];
    // SAFETY: `addr` maps `len` bytes and `residency` has one byte per page of them.
    let rc = unsafe { libc::mincore(addr, len, residency.as_mut_ptr()) };
    let error = io::Error::last_os_error();
    // SAFETY: unmapping exactly the mapping made above.
    unsafe { libc::munmap(addr, len) };
    if rc != 0 {
        return Err(error);
    }
    let cached = residency.iter().filter(|&&byte| byte & 1 == 1).count();
    Ok((cached, pages))
}

/// The read-ahead of the disk that holds `path` (`read_ahead_kb`, KiB): a page fault on a
/// mapping of an uncached file reads up to this much around the faulting page, so a "cold"
/// start on a disk with a large read-ahead caches most of the binary anyway.
pub fn readahead_kb(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path).ok()?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let device = format!("/sys/dev/block/{major}:{minor}");
    // A partition has no queue of its own: its disk's is one level up.
    ["queue/read_ahead_kb", "../queue/read_ahead_kb"]
        .iter()
        .find_map(|file| std::fs::read_to_string(format!("{device}/{file}")).ok())
        .and_then(|kb| kb.trim().parse().ok())
}

//! What this machine's memory can hold. A request that could never fit (a batch of 10^11
//! rows, a read-ahead of 2^40 batches) is refused up front with a message naming it: left to
//! the allocator, it would end the process, since Rust aborts when an allocation fails.

use crate::error::{Error, Result};

/// The memory this process may use, in bytes, if the system says: physical memory, or less
/// where a container's memory limit (cgroup v2 or v1) or an address-space limit (`ulimit -v`)
/// says so. In a container the machine's memory is the host's, which the process never gets.
pub fn physical() -> Option<u64> {
    // SAFETY: sysconf has no preconditions.
    let (page, pages) = unsafe { (libc::sysconf(libc::_SC_PAGESIZE), libc::sysconf(libc::_SC_PHYS_PAGES)) };
    let ram = (page > 0 && pages > 0).then(|| (page as u64).saturating_mul(pages as u64));
    let cgroup = |path: &str| std::fs::read_to_string(path).ok().and_then(|s| s.trim().parse::<u64>().ok());
    let limits = [cgroup("/sys/fs/cgroup/memory.max"), cgroup("/sys/fs/cgroup/memory/memory.limit_in_bytes"), address_space()];
    limits.into_iter().flatten().fold(ram, |m, l| Some(m.map_or(l, |m| m.min(l))))
}

fn address_space() -> Option<u64> {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct it is given.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut r) } == 0;
    (ok && r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}

/// `Error::Config` when `what` needs more than physical memory (`None`: more than u64 counts).
pub fn check_fits(bytes: Option<u64>, what: impl FnOnce() -> String) -> Result<()> {
    let Some(mem) = physical() else { return Ok(()) };
    match bytes {
        Some(n) if n <= mem => Ok(()),
        _ => Err(Error::Config(format!(
            "{} needs {}, more than this machine's memory ({})",
            what(),
            bytes.map_or_else(|| "more than 2^64 bytes".to_string(), human),
            human(mem)
        ))),
    }
}

/// Most threads one pool may start: far beyond any machine's cores, and each thread holds
/// stack and buffers, so a larger count is a mistake (2**40 would start threads until the
/// system refused).
pub const MAX_THREADS: usize = 4096;

/// `Error::Config` unless `1 <= threads <= MAX_THREADS`.
pub fn check_threads(threads: usize) -> Result<()> {
    if (1..=MAX_THREADS).contains(&threads) {
        Ok(())
    } else {
        Err(Error::Config(format!("threads must be between 1 and {MAX_THREADS}, not {threads}")))
    }
}

/// Bytes in binary units, e.g. `23.5 GiB`.
fn human(n: u64) -> String {
    const UNITS: [&str; 7] = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} bytes")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_cannot_fit_is_refused_with_its_size_and_the_machines() {
        let mem = physical().expect("sysconf reports physical memory on the test machines");
        assert!(check_fits(Some(mem), || "all of it".into()).is_ok());
        let err = check_fits(Some(mem + 1), || "one batch".into()).unwrap_err().to_string();
        assert!(err.starts_with("one batch needs ") && err.contains("more than this machine's memory"), "{err}");
        let err = check_fits(None, || "a read-ahead".into()).unwrap_err().to_string();
        assert!(err.contains("more than 2^64 bytes"), "{err}");
        assert_eq!(human(512), "512 bytes");
        // An address-space limit (a container's memory limit reads alike) is what may be used.
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "memory::tests::physical_is_what_this_process_may_use", "--nocapture"])
            .env("TOKSHUF_TEST_LIMIT_AS", "1")
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&child.stdout);
        assert!(child.status.success() && out.contains("1 passed"), "{out}");
    }

    #[test]
    fn physical_is_what_this_process_may_use() {
        if std::env::var_os("TOKSHUF_TEST_LIMIT_AS").is_none() {
            return; // run in a child process by the test above
        }
        let limit = 3u64 << 30;
        let r = libc::rlimit { rlim_cur: limit, rlim_max: limit };
        // SAFETY: setrlimit reads the struct it is given; this process is the test's own child.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &r) }, 0);
        assert!(physical().is_some_and(|m| m <= limit));
        assert_eq!(human(3 << 29), "1.5 GiB");
    }
}

//! What this machine's memory can hold. A request that could never fit (a batch of 10^11
//! rows, a read-ahead of 2^40 batches) is refused up front with a message naming it: left to
//! the allocator, it would end the process, since Rust aborts when an allocation fails.

use crate::error::{Error, Result};

/// Physical memory in bytes, if the system says.
pub fn physical() -> Option<u64> {
    // SAFETY: sysconf has no preconditions.
    let (page, pages) = unsafe { (libc::sysconf(libc::_SC_PAGESIZE), libc::sysconf(libc::_SC_PHYS_PAGES)) };
    (page > 0 && pages > 0).then(|| (page as u64).saturating_mul(pages as u64))
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
        assert_eq!(human(3 << 29), "1.5 GiB");
    }
}

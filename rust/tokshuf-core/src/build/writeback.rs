//! Large files written once, front to back: stage 1's spills and stage 2's shards.
//!
//! Left alone, the kernel keeps a file's dirty pages in memory until the fsync that makes it
//! durable (or until dirty pages reach a tenth of memory), so the disk idles while a thread
//! formats a shard and the thread then idles in fsync while the disk writes it. Here each
//! window of `WINDOW` bytes is handed to the disk as soon as it is full (`sync_file_range`),
//! so writing overlaps the work that produces the next windows and the final fsync waits for
//! about two windows.
//!
//! Shards are not read again by the build, so with `Cache::Drop` each window, once on disk,
//! leaves the page cache: gigabytes of shards would otherwise push out the spills stage 2 is
//! still gathering from (and the pages of whatever else runs on the machine). The writer then
//! waits for the window before its previous one before starting a new one, which paces it to
//! the disk with two windows in flight. Waiting for the previous window itself left the disk
//! idle between windows (stage 2 of a 100 MB build took 1.4 times as long). Spills other
//! machines read (`Cache::Keep`) are read again soon, so only the writing is started early and
//! their pages stay. A one-machine build's spills (`Cache::Scratch`) are deleted at its end,
//! often before the kernel would have written them at all, and never fsynced: writing them
//! early only spent CPU time and disk time the shards wanted. The kernel still writes out
//! whatever it must to free memory.
//!
//! A shard is also flushed to stable storage while it is written (`Flusher`), for disks on
//! which only a flush makes the data durable: a virtual disk that caches writes in its host
//! acknowledges `sync_file_range` at once and writes the data when the guest next flushes,
//! so the shard's final fsync waited for all of it, however early it had been handed over.
//! A thread of the shard's own flushes it (`fdatasync`) as its windows fill, so the final
//! fsync waits for the last few only.
//!
//! On systems without `sync_file_range` (anything but Linux) this is a plain file writer.

use std::borrow::Borrow;
use std::fs::File;
use std::io::Write;
use std::sync::mpsc::{self, SyncSender};
use std::thread::JoinHandle;

/// Bytes handed to the disk at a time. With 8 MiB a shard of a few MB was not handed over
/// before its fsync, which then waited for all of it; 1 MiB was slower than 2.
pub const WINDOW: u64 = 2 << 20;

/// What happens to a window's pages once they are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cache {
    Keep,
    Drop,
    /// Left to the kernel: a file this process deletes soon and never fsyncs.
    Scratch,
}

/// A file written front to back through `Write` (unbuffered: put a `BufWriter` in front).
pub struct Streamed<F: Borrow<File>> {
    file: F,
    cache: Cache,
    /// Bytes written; the first `started` of them were handed to the disk, and the first
    /// `settled` of those are on it (and, with `Cache::Drop`, out of the page cache);
    /// `settling` is where the window before the last one handed over ends.
    written: u64,
    started: u64,
    settling: u64,
    settled: u64,
    /// Started for a `Cache::Drop` file when its first window is full.
    flusher: Option<Flusher>,
}

impl<F: Borrow<File>> Streamed<F> {
    pub fn new(file: F, cache: Cache) -> Self {
        Streamed { file, cache, written: 0, started: 0, settling: 0, settled: 0, flusher: None }
    }

    pub fn file(&self) -> &File {
        self.file.borrow()
    }

    /// Make every byte written durable (fsync, after the flushing thread's last flush, whose
    /// errors it returns), then, with `Cache::Drop`, let the kernel drop the file's pages.
    pub fn sync(&mut self) -> std::io::Result<()> {
        if let Some(flusher) = self.flusher.take() {
            flusher.finish()?;
        }
        self.file().sync_all()?;
        self.settled = self.written;
        if self.cache == Cache::Drop {
            os::drop_pages(self.file(), 0, 0);
        }
        Ok(())
    }

    fn window_full(&mut self) -> std::io::Result<()> {
        if self.cache == Cache::Scratch {
            self.started = self.written;
            return Ok(());
        }
        let (file, first_window) = (self.file.borrow(), self.started == 0);
        os::start_writeback(file, self.started, self.written - self.started)?;
        if self.cache == Cache::Drop && self.settling > self.settled {
            // The window before the previous one: wait until it is on disk, then its pages are
            // clean and can go.
            os::wait_written(file, self.settled, self.settling - self.settled)?;
            os::drop_pages(file, self.settled, self.settling - self.settled);
            self.settled = self.settling;
        }
        self.settling = self.started;
        self.started = self.written;
        if self.cache == Cache::Drop && os::FLUSH_BEHIND {
            if first_window {
                // Without a thread, the final fsync does it all, as before.
                self.flusher = Flusher::start(file).ok();
            }
            if let Some(f) = &self.flusher {
                f.request();
            }
        }
        Ok(())
    }
}

/// Flushes a file to stable storage on a thread of its own, as often as asked (a request made
/// while another waits is covered by that one), and keeps the first error for `finish`: on
/// Linux an error is reported to one fsync only, so the final fsync could not see it.
struct Flusher {
    requests: SyncSender<()>,
    thread: JoinHandle<std::io::Result<()>>,
}

impl Flusher {
    fn start(file: &File) -> std::io::Result<Flusher> {
        let file = file.try_clone()?;
        let (requests, todo) = mpsc::sync_channel::<()>(1);
        let thread = std::thread::Builder::new().name("tokshuf-flush".into()).spawn(move || {
            let mut result = Ok(());
            for () in todo {
                if result.is_ok() {
                    result = file.sync_data();
                }
            }
            result
        })?;
        Ok(Flusher { requests, thread })
    }

    fn request(&self) {
        let _ = self.requests.try_send(());
    }

    /// Wait for the flushes asked for; the first error one met.
    fn finish(self) -> std::io::Result<()> {
        drop(self.requests);
        self.thread.join().unwrap_or_else(|_| Err(std::io::Error::other("the thread flushing a shard stopped")))
    }
}

impl<F: Borrow<File>> Write for Streamed<F> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let n = self.file.borrow().write(data)?;
        self.written += n as u64;
        if self.written - self.started >= WINDOW {
            self.window_full()?;
        }
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(()) // nothing is buffered here; durability is `sync`'s
    }
}

#[cfg(target_os = "linux")]
mod os {
    use std::fs::File;
    use std::os::unix::io::AsRawFd;

    pub const FLUSH_BEHIND: bool = true;

    fn check(r: libc::c_int) -> std::io::Result<()> {
        match r {
            0 => Ok(()),
            _ => {
                let e = std::io::Error::last_os_error();
                // A file system without it (some FUSE or network ones): fsync does it all later.
                if matches!(e.raw_os_error(), Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP) | Some(libc::EINVAL) | Some(libc::ESPIPE)) {
                    Ok(())
                } else {
                    Err(e)
                }
            }
        }
    }

    pub fn start_writeback(f: &File, offset: u64, len: u64) -> std::io::Result<()> {
        // SAFETY: a valid descriptor and plain integers; the call only schedules I/O.
        check(unsafe { libc::sync_file_range(f.as_raw_fd(), offset as i64, len as i64, libc::SYNC_FILE_RANGE_WRITE) })
    }

    pub fn wait_written(f: &File, offset: u64, len: u64) -> std::io::Result<()> {
        let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE | libc::SYNC_FILE_RANGE_WRITE | libc::SYNC_FILE_RANGE_WAIT_AFTER;
        // SAFETY: as above; this one waits for the range's writeback to end.
        check(unsafe { libc::sync_file_range(f.as_raw_fd(), offset as i64, len as i64, flags) })
    }

    /// A hint: pages still dirty or under writeback are simply kept.
    pub fn drop_pages(f: &File, offset: u64, len: u64) {
        // SAFETY: as above; advice only, its result does not matter.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), offset as i64, len as i64, libc::POSIX_FADV_DONTNEED) };
    }
}

#[cfg(not(target_os = "linux"))]
mod os {
    use std::fs::File;

    pub const FLUSH_BEHIND: bool = false;

    pub fn start_writeback(_: &File, _: u64, _: u64) -> std::io::Result<()> {
        Ok(())
    }
    pub fn wait_written(_: &File, _: u64, _: u64) -> std::io::Result<()> {
        Ok(())
    }
    pub fn drop_pages(_: &File, _: u64, _: u64) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn writes_every_byte_in_order_whatever_the_cache_policy() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..(4 * WINDOW + 12345)).map(|i| (i % 251) as u8).collect();
        for cache in [Cache::Keep, Cache::Drop, Cache::Scratch] {
            let path = dir.path().join(format!("{cache:?}"));
            let mut w = std::io::BufWriter::with_capacity(1 << 20, Streamed::new(File::create(&path).unwrap(), cache));
            for piece in data.chunks(777_777) {
                w.write_all(piece).unwrap();
            }
            let mut s = w.into_inner().map_err(|e| e.into_error()).unwrap();
            s.sync().unwrap();
            let mut back = Vec::new();
            File::open(&path).unwrap().read_to_end(&mut back).unwrap();
            assert!(back == data, "{cache:?}: the file differs from what was written");
        }
    }

    /// A flush's error reaches `finish` (and so the shard's `sync`), however many flushes
    /// were asked for: the final fsync would not see it again.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_flushers_errors_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let ok = Flusher::start(&File::create(dir.path().join("f")).unwrap()).unwrap();
        ok.request();
        ok.finish().unwrap();
        // fdatasync fails on /dev/null (EINVAL).
        let null = File::options().write(true).open("/dev/null").unwrap();
        assert!(null.sync_data().is_err());
        let failing = Flusher::start(&null).unwrap();
        for _ in 0..3 {
            failing.request();
        }
        assert!(failing.finish().is_err());
    }
}

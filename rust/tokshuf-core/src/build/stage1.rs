//! Stage 1: read input files, tokenize, and cut each file's id stream into contexts.
//!
//! One reader thread walks the files in order and cuts them into batches of whole lines;
//! batches are tokenized in parallel on the pool (so one huge file still uses every core);
//! the calling thread consumes results strictly in (file, batch) order, windows them and
//! appends the contexts of each file to its own spill file `fNNNNNNNN.ctx` in the work folder.
//! A file's summary JSON is written after its spill is complete (and fsynced where other
//! machines read it, `Stage1Config::shared_work`): its presence marks the file as done, so a
//! resumed build never tokenizes it again unless the spill no longer has the CRC-32 the
//! summary records.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crossbeam_channel::{bounded, unbounded};

use crate::build::doc_window::DocWindow;
use crate::build::input::{self, Line, LineBatcher};
use crate::build::writeback::{Cache, Streamed};
use crate::error::{Error, Result, SkipReason};
use crate::format::{self, Dtype, ErrorPolicy, FileSummary, Tail};
use crate::tokenize::Encoder;

/// Bytes of input lines per tokenizer task. A thread that runs the last task of a file runs it
/// alone, so smaller tasks keep both threads busy to the end of a file of a few MB: with 1 MiB,
/// the tokenize stage of one 10 MB file was up to 11% slower. Larger inputs see no difference.
pub const BATCH_BYTES: usize = 256 << 10;
const MAX_EXAMPLES: usize = 5;

/// What every worker needs to turn lines into ids.
pub struct Stage1Config {
    pub encoder: Arc<dyn Encoder>,
    pub text_key: String,
    pub bos_id: Option<u32>,
    pub eot_id: u32,
    pub pad_id: u32,
    pub seqlen: usize,
    pub dtype: Dtype,
    pub tail: Tail,
    pub errors: ErrorPolicy,
    /// Best-fit packing over windows of this many documents (None: concat).
    pub pack_window: Option<usize>,
    /// Unpacked: every document (cut at `seqlen`) is an example, in the first bin whose upper
    /// bound holds it.
    pub bins: Option<Vec<u32>>,
    /// Ids must be below this (checked where they are not made here: shards as inputs).
    pub vocab_size: u32,
    /// The inputs as the recipe records them: how tokshuf.json names a skipped line's file.
    pub input_names: Vec<String>,
    /// Their sizes as the recipe records them: a file read to another size changed since.
    pub input_bytes: Vec<u64>,
    /// The longest line a build may hold (`max_line`), in bytes.
    pub max_line: usize,
    /// Other machines read the work folder (the Ray engine): each spill (and positions file) is
    /// handed to the disk as it is written and fsynced before its summary, and the summary
    /// too (a shared file system reports some write errors only to fsync). A one-machine build
    /// reads its spills back from this machine's page cache and deletes them at its end, and
    /// a resumed build checks each against the CRC-32 its summary records and redoes a file
    /// whose summary cannot be read (`resume::check_spills`), so it leaves both to the kernel:
    /// waiting for the disk there only delayed stage 2.
    pub shared_work: bool,
}

impl Stage1Config {
    /// The bytes of ids a best-fit window holds in memory (`DocWindow`; 0 without best fit):
    /// `pack_window` contexts, or as much as the longest line if more; the rest of a window
    /// waits on disk.
    pub fn window_bytes(&self) -> usize {
        self.pack_window.map_or(0, |w| (w * self.seqlen * 4).max(self.max_line))
    }
}

/// The longest line a build with `memory_limit` holds: tokenizing a line takes about five
/// times its bytes, so an eighth of the limit, but never less than `MIN_MAX_LINE`, which the
/// constant beside the limit covers. Like the limit, it never changes the bytes of a cache:
/// a longer line stops the build.
pub fn max_line(memory_limit: u64) -> usize {
    // A limit beyond this machine's memory (2**50, say) must not lift the cap with it: a line
    // of gigabytes would then abort the process when its ids cannot be allocated.
    let limit = crate::memory::physical().map_or(memory_limit, |m| memory_limit.min(m));
    (limit / 8).clamp(MIN_MAX_LINE, usize::MAX as u64) as usize
}

pub const MIN_MAX_LINE: u64 = 16 << 20;

/// Names of file `file`'s spill and summary in the work folder.
pub fn spill_name(file: usize) -> String {
    format!("f{file:08}.ctx")
}

pub fn summary_name(file: usize) -> String {
    format!("f{file:08}.json")
}

pub fn spill_path(work: &Path, file: usize) -> PathBuf {
    work.join(spill_name(file))
}

/// Unpacked builds: where the examples of `file` that fall in bin `bin` are in its spill, one
/// (byte offset, number of ids) pair of little-endian u64s per example, in file order.
pub fn pos_path(work: &Path, file: usize, bin: usize) -> PathBuf {
    work.join(format!("f{file:08}.b{bin:02}.pos"))
}

/// Bytes of one entry of a `pos_path` file.
pub const POS_BYTES: u64 = 16;

pub fn summary_path(work: &Path, file: usize) -> PathBuf {
    work.join(summary_name(file))
}

enum Job {
    Lines { file: usize, first_line: u64, buf: Vec<u8>, ends: Vec<usize> },
    StreamError { file: usize, line: u64, error: std::io::Error },
    FileEnd { file: usize },
    OpenError { error: Error },
}

#[derive(Default)]
struct Tokenized {
    ids: Vec<u32>,
    /// Ids of each document in `ids` (with its BOS and EOT), in order.
    doc_lens: Vec<u32>,
    documents: u64,
    empty: u64,
    blank: u64,
    text_bytes: u64,
    skipped: Vec<(SkipReason, u64, String)>,
}

enum Done {
    Lines { file: usize, out: std::result::Result<Tokenized, Error>, slots: usize },
    Passthrough(Job),
}

/// Slots of the in-flight bound `job` takes: one per `batch_bytes` of lines (a batch ends at
/// the first line past `batch_bytes`, so an ordinary one takes one), at most all of them.
fn slots(job: &Job, batch_bytes: usize, in_flight: usize) -> usize {
    match job {
        Job::Lines { buf, .. } => (buf.len() / batch_bytes.max(1)).clamp(1, in_flight),
        _ => 1,
    }
}

/// What the caller of `run` hears about, on the consuming thread, in file order per file.
pub enum Event<'a> {
    /// The first `count` contexts of `file` are in its spill and readable through `spill`,
    /// and `padded` lists those that end in padding, as the summary will (sent each time the
    /// count passes a multiple of `notify_every`).
    Contexts { file: usize, count: u64, spill: &'a Arc<File>, padded: &'a [(u64, u32)] },
    /// `file` is done: its spill is renamed into place and its summary is durable.
    Done { file: usize, summary: &'a FileSummary, spill_bytes: u64 },
    /// Nothing arrived for a while (lets the caller do its own bookkeeping).
    Idle,
}

/// How stage 1 walks its files.
#[derive(Clone, Copy)]
pub struct Schedule {
    /// Files read at the same time, one batch each in turn (1: one file after another).
    pub window: usize,
    /// Send `Event::Contexts` every this many contexts of a file (0: never).
    pub notify_every: u64,
    /// Bytes of input lines per tokenizer task (and per turn of a file).
    pub batch_bytes: usize,
    /// Memory the open files' buffers and decoders (`input::Opened`), and best fit's windows,
    /// may hold together: a file waits to be opened until it fits, unless no other file is open.
    pub open_budget: u64,
}

impl Schedule {
    /// The read and write buffers of each open file: 1 MiB shared by the files read at once.
    fn buffer(&self) -> usize {
        ((1usize << 20) / self.window.max(1)).max(64 << 10)
    }
}

/// Tokenize `files` (indices into `paths`, ascending) and write their spills into `work`.
/// `on_event` runs on the calling thread; an error from it stops stage 1.
#[allow(clippy::too_many_arguments)]
pub fn run(
    cfg: &Arc<Stage1Config>,
    paths: &[PathBuf],
    files: &[usize],
    work: &Path,
    pool: &Arc<rayon::ThreadPool>,
    cancel: &Arc<AtomicBool>,
    schedule: Schedule,
    mut on_event: impl FnMut(Event<'_>) -> Result<()>,
) -> Result<()> {
    if files.is_empty() {
        return Ok(());
    }
    // Enough batches that the workers run on while this thread waits on a finished file's
    // fsync, where spills are synced (docs/performance.md, round six, has the measurements).
    let in_flight = (pool.current_num_threads() * 8).max(8);
    // Bounds the bytes in flight: a batch takes a slot per `batch_bytes` it holds (a batch of
    // one long line, up to `max_line`, takes them all), so that many long lines are not
    // tokenized and held at once.
    let (slot_tx, slot_rx) = bounded::<()>(in_flight);
    let (done_tx, done_rx) = unbounded::<(u64, Done)>();
    let stop = Arc::new(AtomicBool::new(false));
    let window = schedule.window.max(1);
    let batch_bytes = schedule.batch_bytes.max(1);
    let buffer = schedule.buffer();

    let reader = {
        let paths: Vec<(usize, PathBuf)> = files.iter().map(|&f| (f, paths[f].clone())).collect();
        let (cfg, stop, cancel) = (cfg.clone(), stop.clone(), cancel.clone());
        let pool = pool.clone();
        std::thread::Builder::new()
            .name("tokshuf-reader".into())
            .spawn(move || {
                let mut seq = 0u64;
                let mut emit = |job: Job| -> bool {
                    let n = slots(&job, batch_bytes, in_flight);
                    for _ in 0..n {
                        if stop.load(Ordering::Relaxed) || cancel.load(Ordering::Relaxed) || slot_tx.send(()).is_err() {
                            return false;
                        }
                    }
                    let s = seq;
                    seq += 1;
                    match job {
                        Job::Lines { file, first_line, buf, ends } => {
                            let (cfg, tx, stop) = (cfg.clone(), done_tx.clone(), stop.clone());
                            let path = paths.iter().find(|(f, _)| *f == file).map(|(_, p)| p.clone()).unwrap_or_default();
                            pool.spawn(move || {
                                let out = if stop.load(Ordering::Relaxed) {
                                    Ok(Tokenized::default())
                                } else {
                                    tokenize_batch(&cfg, &path, first_line, &buf, &ends)
                                };
                                let _ = tx.send((s, Done::Lines { file, out, slots: n }));
                            });
                        }
                        other => {
                            let _ = done_tx.send((s, Done::Passthrough(other)));
                        }
                    }
                    true
                };
                // Up to `window` files are open; each turn reads one batch of the first and
                // puts it back at the end, so open files advance together.
                let mut queue = paths.iter();
                let mut open: std::collections::VecDeque<(usize, u64, LineBatcher<_>)> = std::collections::VecDeque::new();
                // The next file, opened but not read (its decoder holds little until then)
                // while it does not fit beside the open ones; and what those hold.
                let mut next: Option<(usize, input::Opened)> = None;
                let mut held = 0u64;
                // Best fit holds a window of documents per open file, in memory up to this.
                let packing = cfg.window_bytes() as u64;
                loop {
                    while open.len() < window {
                        let (file, opened) = match next.take() {
                            Some(n) => n,
                            None => {
                                let Some((file, path)) = queue.next() else { break };
                                match input::open(path, cfg.input_bytes.get(*file).copied(), buffer) {
                                    Ok(opened) => (*file, opened),
                                    Err(error) => {
                                        emit(Job::OpenError { error });
                                        return;
                                    }
                                }
                            }
                        };
                        let memory = opened.memory + packing;
                        if !open.is_empty() && held + memory > schedule.open_budget {
                            next = Some((file, opened));
                            break;
                        }
                        held += memory;
                        open.push_back((file, memory, LineBatcher::new(opened.reader, cfg.max_line)));
                    }
                    let Some((file, memory, mut lines)) = open.pop_front() else { return };
                    let (mut buf, mut ends) = (Vec::with_capacity(batch_bytes + 4096), Vec::new());
                    let first_line = lines.next_line;
                    match lines.fill(&mut buf, &mut ends, batch_bytes) {
                        Ok(true) => {
                            if !emit(Job::Lines { file, first_line, buf, ends }) {
                                return;
                            }
                            open.push_back((file, memory, lines));
                        }
                        Ok(false) => {
                            held -= memory;
                            if !emit(Job::FileEnd { file }) {
                                return;
                            }
                        }
                        Err(error) => {
                            held -= memory;
                            // Lines read before the failure in this batch are still good.
                            let line = lines.next_line;
                            if !ends.is_empty() && !emit(Job::Lines { file, first_line, buf, ends }) {
                                return;
                            }
                            if !emit(Job::StreamError { file, line, error }) || !emit(Job::FileEnd { file }) {
                                return;
                            }
                        }
                    }
                }
            })
            .map_err(|e| Error::Config(format!("cannot start reader thread: {e}")))?
    };

    let mut writers: HashMap<usize, FileWriter> = HashMap::new();
    let ctx = Consume { cfg, paths, work, done_rx: &done_rx, slot_rx: &slot_rx, cancel, schedule };
    let result = ctx.run(&mut writers, &mut on_event, files.len());
    stop.store(true, Ordering::Relaxed);
    drop(slot_rx); // unblocks the reader if it waits for a slot
    let _ = reader.join();
    // Every task holds a sender: draining until all are gone means none outlives this call.
    while done_rx.recv().is_ok() {}
    // Spills of files left unfinished (an error, Ctrl-C) are redone by the next run anyway;
    // removing them now gives their space back (it may be a full disk that stopped us).
    for (_, w) in writers.drain() {
        let tmps = w.tmp_paths();
        drop(w);
        for tmp in tmps {
            let _ = std::fs::remove_file(tmp);
        }
    }
    result
}

struct Consume<'a> {
    cfg: &'a Stage1Config,
    paths: &'a [PathBuf],
    work: &'a Path,
    done_rx: &'a crossbeam_channel::Receiver<(u64, Done)>,
    slot_rx: &'a crossbeam_channel::Receiver<()>,
    cancel: &'a AtomicBool,
    schedule: Schedule,
}

impl Consume<'_> {
    fn run(
        &self,
        writers: &mut HashMap<usize, FileWriter>,
        on_event: &mut impl FnMut(Event<'_>) -> Result<()>,
        mut files_left: usize,
    ) -> Result<()> {
        let (cfg, paths, work) = (self.cfg, self.paths, self.work);
        let mut pending: BTreeMap<u64, Done> = BTreeMap::new();
        let mut next = 0u64;
        let buffer = self.schedule.buffer();
        while files_left > 0 {
            if self.cancel.load(Ordering::Relaxed) {
                return Err(Error::Interrupted);
            }
            let (seq, done) = match self.done_rx.recv_timeout(std::time::Duration::from_millis(100)) {
                Ok(v) => v,
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                    on_event(Event::Idle)?;
                    continue;
                }
                Err(_) => return Err(Error::Config("stage 1 workers stopped unexpectedly".into())),
            };
            pending.insert(seq, done);
            while let Some(done) = pending.remove(&next) {
                // Small files arrive whole: a Ctrl-C must not wait for all of them.
                if self.cancel.load(Ordering::Relaxed) {
                    return Err(Error::Interrupted);
                }
                next += 1;
                let slots = match &done {
                    Done::Lines { slots, .. } => *slots,
                    Done::Passthrough(_) => 1,
                };
                for _ in 0..slots {
                    let _ = self.slot_rx.try_recv();
                }
                let file = match &done {
                    Done::Lines { file, .. } => *file,
                    Done::Passthrough(Job::Lines { file, .. } | Job::StreamError { file, .. } | Job::FileEnd { file }) => *file,
                    Done::Passthrough(Job::OpenError { .. }) => usize::MAX,
                };
                if file != usize::MAX && !writers.contains_key(&file) {
                    writers.insert(file, FileWriter::create(cfg, work, file, buffer)?);
                }
                match done {
                    Done::Passthrough(Job::OpenError { error }) => return Err(error),
                    Done::Lines { out, .. } => {
                        let t = out?;
                        let w = writers.get_mut(&file).expect("inserted above");
                        w.absorb(cfg, name(cfg, file), t)?;
                        let every = self.schedule.notify_every;
                        let n = w.summary.num_contexts;
                        if every > 0 && n / every > w.notified / every {
                            w.out.flush().map_err(|e| Error::io(&w.tmp, e))?;
                            w.notified = n;
                            on_event(Event::Contexts { file, count: n, spill: &w.shared, padded: &w.summary.padded })?;
                        }
                    }
                    Done::Passthrough(Job::StreamError { line, error, .. }) => {
                        if crate::storage::remote_error(&error).is_some() {
                            return Err(crate::storage::unwrap_io(&crate::storage::Location::Local(paths[file].clone()), error));
                        }
                        if let Some(long) = error.get_ref().and_then(|e| e.downcast_ref::<input::LineTooLong>()) {
                            return Err(Error::Config(format!(
                                "{}:{line}: {long}: a build holds lines up to an eighth of memory_limit (at least {} MiB, and at most an eighth of the memory this process may use); raise memory_limit, or run where more memory is",
                                paths[file].display(),
                                MIN_MAX_LINE >> 20
                            )));
                        }
                        let w = writers.get_mut(&file).expect("inserted above");
                        let reason = format!("cannot decompress or read: {error}");
                        match cfg.errors {
                            ErrorPolicy::Raise => {
                                return Err(Error::BadInput { path: paths[file].clone(), line, reason, kind: SkipReason::CorruptStream })
                            }
                            ErrorPolicy::Skip => w.skip(name(cfg, file), SkipReason::CorruptStream, line, &reason),
                        }
                    }
                    Done::Passthrough(Job::FileEnd { .. }) => {
                        let w = writers.remove(&file).expect("inserted above");
                        let tmps = w.tmp_paths();
                        let (summary, spill_bytes) = w.finish(cfg, cfg.tail, work, file).inspect_err(|_| {
                            for tmp in &tmps {
                                let _ = std::fs::remove_file(tmp);
                            }
                        })?;
                        on_event(Event::Done { file, summary: &summary, spill_bytes })?;
                        files_left -= 1;
                    }
                    Done::Passthrough(Job::Lines { .. }) => unreachable!("lines are always tokenized"),
                }
            }
        }
        Ok(())
    }
}

/// How tokshuf.json names input `file`.
fn name(cfg: &Stage1Config, file: usize) -> &str {
    cfg.input_names.get(file).map_or("", String::as_str)
}

fn tokenize_batch(cfg: &Stage1Config, path: &Path, first_line: u64, buf: &[u8], ends: &[usize]) -> Result<Tokenized> {
    // Room for what the encoder reserves before each document (half its bytes): the ids of a
    // batch then rarely move.
    let mut t = Tokenized { ids: Vec::with_capacity(buf.len() / 2 + 32 * ends.len()), ..Default::default() };
    let mut start = 0;
    for (i, &end) in ends.iter().enumerate() {
        let raw = &buf[start..end];
        start = end;
        let raw = raw.strip_suffix(b"\n").unwrap_or(raw);
        let line_no = first_line + i as u64;
        match input::parse_line(raw, &cfg.text_key) {
            Line::Blank => t.blank += 1,
            Line::Bad(kind, reason) => match cfg.errors {
                ErrorPolicy::Raise => return Err(Error::BadInput { path: path.to_path_buf(), line: line_no, reason, kind }),
                ErrorPolicy::Skip => t.skipped.push((kind, line_no, reason)),
            },
            Line::Text(text) if text.is_empty() => t.empty += 1,
            Line::Text(text) => {
                let mark = t.ids.len();
                t.ids.extend(cfg.bos_id);
                match cfg.encoder.encode_into(&text, &mut t.ids) {
                    Ok(()) => {
                        t.ids.push(cfg.eot_id);
                        t.doc_lens.push((t.ids.len() - mark) as u32);
                        t.documents += 1;
                        t.text_bytes += text.len() as u64;
                    }
                    Err(reason) => {
                        t.ids.truncate(mark); // nothing of a failed document reaches the cache
                        let kind = SkipReason::TokenizerFailed;
                        match cfg.errors {
                            ErrorPolicy::Raise => return Err(Error::BadInput { path: path.to_path_buf(), line: line_no, reason, kind }),
                            ErrorPolicy::Skip => t.skipped.push((kind, line_no, reason)),
                        }
                    }
                }
            }
        }
    }
    Ok(t)
}

/// Cuts one file's id stream into contexts and appends them to its spill (also used by
/// `shards`, whose contexts come whole).
pub(super) struct FileWriter {
    /// Other threads may read the spill's finished part while it is written (streaming builds).
    out: BufWriter<Streamed<Arc<File>>>,
    shared: Arc<File>,
    pub(super) tmp: PathBuf,
    cur: Vec<u32>,
    bytes: Vec<u8>,
    pub(super) summary: FileSummary,
    notified: u64,
    /// Best-fit packing: the documents of the current window, and where the file's id stream
    /// would be under concat (to count the documents concat would split).
    window: DocWindow,
    concat_pos: u64,
    /// Unpacked builds: each bin's positions file (`pos_path`), and the spill's length so far.
    bins: Vec<(BufWriter<File>, PathBuf)>,
    spill_len: u64,
    /// CRC-32 of the spill's bytes, and of each positions file's, so far.
    crc: crc32fast::Hasher,
    pos_crc: Vec<crc32fast::Hasher>,
}

impl FileWriter {
    pub(super) fn create(cfg: &Stage1Config, work: &Path, file: usize, buffer: usize) -> Result<Self> {
        let tmp = format::tmp_name(&spill_path(work, file));
        let f =
            std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&tmp).map_err(|e| Error::io(&tmp, e))?;
        let shared = Arc::new(f);
        let nbins = cfg.bins.as_ref().map_or(0, Vec::len);
        let bins = (0..nbins)
            .map(|k| {
                let tmp = format::tmp_name(&pos_path(work, file, k));
                let f = File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
                Ok((BufWriter::with_capacity(16 << 10, f), tmp))
            })
            .collect::<Result<Vec<_>>>()?;
        let summary = FileSummary { bin_examples: vec![0; nbins], bin_tokens: vec![0; nbins], ..Default::default() };
        Ok(FileWriter {
            // Stage 2 reads the spill soon: its pages stay in the page cache.
            out: BufWriter::with_capacity(
                buffer,
                Streamed::new(shared.clone(), if cfg.shared_work { Cache::Keep } else { Cache::Scratch }),
            ),
            shared,
            tmp,
            cur: Vec::with_capacity(cfg.seqlen),
            bytes: Vec::new(),
            summary,
            notified: 0,
            window: DocWindow::new(cfg.window_bytes() / 4, cfg.dtype, work),
            concat_pos: 0,
            bins,
            spill_len: 0,
            crc: crc32fast::Hasher::new(),
            pos_crc: vec![crc32fast::Hasher::new(); nbins],
        })
    }

    /// Every file this writer has under a temporary name.
    fn tmp_paths(&self) -> Vec<PathBuf> {
        std::iter::once(self.tmp.clone()).chain(self.bins.iter().map(|b| b.1.clone())).collect()
    }

    /// Count a document of `n` ids for the packing figures: split by this mode (longer than a
    /// context), and split had it been concatenated.
    fn count_split(&mut self, cfg: &Stage1Config, n: usize) {
        let seqlen = cfg.seqlen as u64;
        let (first, last) = (self.concat_pos / seqlen, (self.concat_pos + n as u64 - 1) / seqlen);
        self.summary.concat_documents_split += (first != last) as u64;
        self.summary.documents_split += (n > cfg.seqlen) as u64;
        self.concat_pos += n as u64;
    }

    fn skip(&mut self, name: &str, kind: SkipReason, line: u64, reason: &str) {
        *self.summary.skipped.entry(kind.name().to_string()).or_default() += 1;
        let ex = self.summary.skipped_examples.entry(kind.name().to_string()).or_default();
        if ex.len() < MAX_EXAMPLES {
            ex.push(format!("{name}:{line}: {reason}"));
        }
    }

    fn absorb(&mut self, cfg: &Stage1Config, name: &str, t: Tokenized) -> Result<()> {
        for (kind, line, reason) in &t.skipped {
            self.skip(name, *kind, *line, reason);
        }
        let s = &mut self.summary;
        s.num_documents += t.documents;
        s.empty_documents += t.empty;
        s.blank_lines += t.blank;
        s.text_bytes += t.text_bytes;
        s.num_tokens += t.ids.len() as u64;
        if let Some(bounds) = &cfg.bins {
            let mut at = 0;
            for &n in &t.doc_lens {
                let n = n as usize;
                self.count_split(cfg, n);
                for piece in t.ids[at..at + n].chunks(cfg.seqlen) {
                    self.write_example(cfg, bounds, piece)?;
                }
                at += n;
            }
            return Ok(());
        }
        if let Some(window) = cfg.pack_window {
            let mut at = 0;
            for &n in &t.doc_lens {
                let n = n as usize;
                self.count_split(cfg, n);
                self.window.push(&t.ids[at..at + n])?;
                at += n;
                if self.window.len() >= window {
                    self.pack_window(cfg)?;
                }
            }
            return Ok(());
        }
        let mut ids = &t.ids[..];
        while !ids.is_empty() {
            let take = (cfg.seqlen - self.cur.len()).min(ids.len());
            if self.cur.is_empty() && take == cfg.seqlen {
                self.write_context(cfg, &ids[..take])?;
            } else {
                self.cur.extend_from_slice(&ids[..take]);
                if self.cur.len() == cfg.seqlen {
                    let ctx = std::mem::take(&mut self.cur);
                    self.write_context(cfg, &ctx)?;
                    self.cur = ctx;
                    self.cur.clear();
                }
            }
            ids = &ids[take..];
        }
        Ok(())
    }

    /// Place the window's documents by best fit (`pack`) and write the contexts, padded.
    fn pack_window(&mut self, cfg: &Stage1Config) -> Result<()> {
        let mut ctx = Vec::with_capacity(cfg.seqlen);
        for pieces in super::pack::bestfit(self.window.lens(), cfg.seqlen) {
            ctx.clear();
            for p in pieces {
                self.window.piece(p.doc, p.start, p.end, &mut ctx)?;
            }
            let pad = cfg.seqlen - ctx.len();
            if pad > 0 {
                self.summary.padded.push((self.summary.num_contexts, pad as u32));
                ctx.resize(cfg.seqlen, cfg.pad_id);
            }
            self.write_context(cfg, &ctx)?;
        }
        self.window.clear();
        Ok(())
    }

    /// Unpacked: append one example to the spill and its place to its bin's positions.
    fn write_example(&mut self, cfg: &Stage1Config, bounds: &[u32], ids: &[u32]) -> Result<()> {
        let k = bounds.partition_point(|&b| (b as usize) < ids.len());
        encode_ids(cfg.dtype, ids, &mut self.bytes);
        crate::testhook::charge(self.bytes.len()).and_then(|_| self.out.write_all(&self.bytes)).map_err(|e| Error::io(&self.tmp, e))?;
        let (pos, tmp) = &mut self.bins[k];
        let mut entry = [0u8; POS_BYTES as usize];
        entry[..8].copy_from_slice(&self.spill_len.to_le_bytes());
        entry[8..].copy_from_slice(&(ids.len() as u64).to_le_bytes());
        pos.write_all(&entry).map_err(|e| Error::io(&*tmp, e))?;
        self.crc.update(&self.bytes);
        self.pos_crc[k].update(&entry);
        self.spill_len += self.bytes.len() as u64;
        self.summary.num_contexts += 1;
        self.summary.bin_examples[k] += 1;
        self.summary.bin_tokens[k] += ids.len() as u64;
        Ok(())
    }

    pub(super) fn write_context(&mut self, cfg: &Stage1Config, ids: &[u32]) -> Result<()> {
        encode_ids(cfg.dtype, ids, &mut self.bytes);
        crate::testhook::charge(self.bytes.len()).and_then(|_| self.out.write_all(&self.bytes)).map_err(|e| Error::io(&self.tmp, e))?;
        self.crc.update(&self.bytes);
        self.summary.num_contexts += 1;
        Ok(())
    }

    /// Publish the spill (fsync where `cfg.shared_work`, rename) and then the summary that marks
    /// the file done.
    pub(super) fn finish(mut self, cfg: &Stage1Config, tail_policy: Tail, work: &Path, file: usize) -> Result<(FileSummary, u64)> {
        if cfg.pack_window.is_some() {
            self.pack_window(cfg)?; // best fit has no tail: the last window is packed like any
        }
        let tail = std::mem::take(&mut self.cur);
        match tail_policy {
            Tail::Stitch => self.summary.tail = tail,
            Tail::Drop => {
                self.summary.dropped_tokens = tail.len() as u64;
                self.summary.num_tokens -= tail.len() as u64;
            }
            Tail::Pad if !tail.is_empty() => {
                let pad = cfg.seqlen - tail.len();
                let mut ctx = tail;
                ctx.resize(cfg.seqlen, cfg.pad_id);
                let pos = self.summary.num_contexts;
                self.write_context(cfg, &ctx)?;
                self.summary.padded.push((pos, pad as u32));
            }
            Tail::Pad => {}
        }
        self.out.flush().map_err(|e| Error::io(&self.tmp, e))?;
        let f = &self.shared;
        if cfg.shared_work {
            f.sync_all().map_err(|e| Error::io(&self.tmp, e))?;
        }
        let spill_bytes = f.metadata().map(|m| m.len()).unwrap_or(0);
        for (k, (pos, tmp)) in std::mem::take(&mut self.bins).into_iter().enumerate() {
            let f = pos.into_inner().map_err(|e| Error::io(&tmp, e.into_error()))?;
            if cfg.shared_work {
                f.sync_all().map_err(|e| Error::io(&tmp, e))?;
            }
            let path = pos_path(work, file, k);
            std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))?;
        }
        let path = spill_path(work, file);
        std::fs::rename(&self.tmp, &path).map_err(|e| Error::io(&path, e))?;
        crate::testhook::point("stage1.spill");
        self.summary.spill_crc32 = Some(self.crc.clone().finalize());
        self.summary.pos_crc32 = self.pos_crc.iter().map(|h| h.clone().finalize()).collect();
        format::write_atomic_synced_if(&summary_path(work, file), &format::to_json_bytes(&self.summary), cfg.shared_work)?;
        crate::testhook::point("stage1.file");
        Ok((self.summary, spill_bytes))
    }
}

/// Window the files' tails (`tails`, in file order) as one id stream into the spill of input
/// `file`, padding the last context. The tails come one at a time: a build of many files would
/// otherwise hold nearly a context of ids for each of them.
pub fn write_stitched(
    cfg: &Stage1Config,
    work: &Path,
    file: usize,
    tails: impl IntoIterator<Item = Result<Vec<u32>>>,
) -> Result<FileSummary> {
    let mut w = FileWriter::create(cfg, work, file, 1 << 20)?;
    let tmp = w.tmp.clone();
    let absorbed = tails.into_iter().try_for_each(|ids| w.absorb(cfg, "", Tokenized { ids: ids?, ..Default::default() }));
    let r = absorbed.and_then(|_| w.finish(cfg, Tail::Pad, work, file));
    if r.is_err() {
        let _ = std::fs::remove_file(tmp);
    }
    Ok(r?.0)
}

pub fn encode_ids(dtype: Dtype, ids: &[u32], out: &mut Vec<u8>) {
    out.clear();
    match dtype {
        Dtype::Uint16 => out.extend(ids.iter().flat_map(|&i| (i as u16).to_le_bytes())),
        Dtype::Uint32 => out.extend(ids.iter().flat_map(|&i| i.to_le_bytes())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One id per byte; refuses any text holding U+0001, as a tokenizer may refuse a document.
    struct Picky;

    impl Encoder for Picky {
        fn encode_into(&self, text: &str, out: &mut Vec<u32>) -> std::result::Result<(), String> {
            out.extend(text.bytes().map(u32::from));
            if text.contains('\u{1}') {
                return Err("cannot encode U+0001".into()); // after writing some ids, on purpose
            }
            Ok(())
        }
        fn decode(&self, _: &[u32]) -> std::result::Result<String, String> {
            Ok(String::new())
        }
    }

    fn cfg(errors: ErrorPolicy) -> Stage1Config {
        Stage1Config {
            encoder: Arc::new(Picky),
            text_key: "text".into(),
            bos_id: Some(7),
            eot_id: 9,
            pad_id: 9,
            seqlen: 4,
            dtype: Dtype::Uint16,
            tail: Tail::Stitch,
            errors,
            pack_window: None,
            bins: None,
            vocab_size: 256,
            input_names: vec!["in.jsonl".into()],
            input_bytes: vec![],
            max_line: 1 << 20,
            shared_work: true,
        }
    }

    #[test]
    fn a_document_the_tokenizer_refuses_follows_the_policy() {
        let lines = b"{\"text\": \"ab\"}\n{\"text\": \"x\\u0001y\"}\n{\"text\": \"c\"}\n";
        let ends: Vec<usize> = lines.iter().enumerate().filter(|(_, &b)| b == b'\n').map(|(i, _)| i + 1).collect();
        let path = Path::new("in.jsonl");
        let t = tokenize_batch(&cfg(ErrorPolicy::Skip), path, 10, lines, &ends).unwrap();
        // Nothing of the refused document (not even its BOS) is kept.
        assert_eq!(t.ids, vec![7, 97, 98, 9, 7, 99, 9]);
        assert_eq!(t.documents, 2);
        assert_eq!(t.skipped.len(), 1);
        assert_eq!((t.skipped[0].0, t.skipped[0].1), (SkipReason::TokenizerFailed, 11));
        match tokenize_batch(&cfg(ErrorPolicy::Raise), path, 10, lines, &ends) {
            Err(e @ Error::BadInput { kind: SkipReason::TokenizerFailed, line: 11, .. }) => {
                assert_eq!(e.to_string(), "in.jsonl:11: cannot encode U+0001");
            }
            other => panic!("{:?}", other.map(|t| t.ids)),
        }
    }

    /// A best-fit window whose documents pass its budget waits partly on disk (`DocWindow`)
    /// and gives the same spill, byte for byte, as one held in memory.
    #[test]
    fn a_best_fit_window_past_its_budget_gives_the_same_contexts() {
        let dir = tempfile::tempdir().unwrap();
        let text: String = (0..300).map(|i| format!("{{\"text\": \"{}\"}}\n", &"abcdefghij".repeat(5)[..3 + i * 7 % 41])).collect();
        let path = dir.path().join("in.jsonl");
        std::fs::write(&path, text).unwrap();
        let pool = Arc::new(rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap());
        let spill = |max_line: usize| {
            let cfg = Arc::new(Stage1Config { pack_window: Some(6), max_line, ..cfg(ErrorPolicy::Raise) });
            let work = tempfile::tempdir().unwrap();
            let schedule = Schedule { window: 1, notify_every: 0, batch_bytes: 256, open_budget: u64::MAX };
            run(&cfg, std::slice::from_ref(&path), &[0], work.path(), &pool, &Arc::default(), schedule, |_| Ok(())).unwrap();
            (cfg.window_bytes(), std::fs::read(spill_path(work.path(), 0)).unwrap())
        };
        let (in_memory, want) = spill(1 << 20);
        let (on_disk, got) = spill(64);
        // 6 contexts of 4 ids: 96 bytes, about two documents, where a window holds six.
        assert_eq!((in_memory, on_disk), (1 << 20, 96));
        assert!(want.len() > 300 * 4 * 2, "{} bytes", want.len());
        assert!(got == want, "the spills differ");
    }

    #[test]
    fn files_wait_to_be_opened_until_their_decoders_fit() {
        let dir = tempfile::tempdir().unwrap();
        let line = b"{\"text\": \"abcdefgh\"}\n".repeat(200);
        let paths: Vec<PathBuf> = (0..3)
            .map(|f| {
                let p = dir.path().join(format!("in{f}.jsonl.zst"));
                std::fs::write(&p, zstd::bulk::compress(&line, 3).unwrap()).unwrap();
                p
            })
            .collect();
        let cfg = Arc::new(Stage1Config { input_names: (0..3).map(|f| format!("in{f}.jsonl.zst")).collect(), ..cfg(ErrorPolicy::Raise) });
        let pool = Arc::new(rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap());
        // The files' first contexts and their ends, in the order the consumer sees them.
        let order = |open_budget: u64| {
            let work = tempfile::tempdir().unwrap();
            let mut seen = Vec::new();
            let schedule = Schedule { window: 3, notify_every: 1, batch_bytes: 256, open_budget };
            run(&cfg, &paths, &[0, 1, 2], work.path(), &pool, &Arc::default(), schedule, |ev| {
                match ev {
                    Event::Contexts { file, .. } if !seen.contains(&(file, "first")) => seen.push((file, "first")),
                    Event::Done { file, .. } => seen.push((file, "done")),
                    _ => {}
                }
                Ok(())
            })
            .unwrap();
            seen
        };
        // Room for all three: they are read side by side.
        let side_by_side = order(u64::MAX);
        assert_eq!(side_by_side[..3], [(0, "first"), (1, "first"), (2, "first")]);
        // Room for one zstd file (any of whose frames may declare zstd's largest window):
        // one file after another.
        let one_by_one = order(200 << 20);
        assert_eq!(one_by_one, [(0, "first"), (0, "done"), (1, "first"), (1, "done"), (2, "first"), (2, "done")]);
    }
}

//! Reading unpacked caches (DESIGN §9, `packing="none"`): every global batch comes from one
//! length bin.
//!
//! Global batch b is drawn from bin k with the blend schedule of §7 over the bins, weighted
//! by their example counts: `(k, β) = schedule.locate(b)`, so over every period of D batches
//! bin k gives exactly q_k of them and bins are drawn in proportion to their size. Inside bin
//! k, batch b is the bin's own batch β: its examples `[β B, (β + 1) B)` of the bin's §6 order
//! (the bin's chunks, R*, seed, reshuffle), and rank r of R takes every R-th of them from r,
//! as for a packed cache. Global example m is example `m mod B` of global batch `m div B`.
//! Everything is O(1) (O(log S) inside a bin's order): seeking reads no data.
//!
//! A batch is padded to its longest example — the longest of the *global* batch, so every
//! rank's slice has the same shape and the slices of all ranks make up the one-rank batch —
//! or to the bin's bound (`pad_to_bin`). Empty bins are never drawn.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::blend::{Schedule, DEFAULT_QUANTUM};
use super::buffers::{BufferPool, Reservation};
use super::cache::{check_shards_of, parse_manifest_all, Cache, CacheMeta, Id};
use super::members::copy_ids;
use super::order::{cache_source, Loc, OrderOptions, Source};
use super::reader::{batch_bytes, Assemble, Batch, OutDtype, MAX_EXAMPLE};
use super::validate::{read_manifest_text, read_meta_any};
use crate::error::{Error, Result};
use crate::format::{self, BinInfo, Dtype, Metadata, MANIFEST_NAME, META_NAME};

/// Length bins an unpacked cache may have (`bin_00` .. `bin_99`).
const MAX_BINS: usize = 100;

/// An opened, validated unpacked cache: one sub-cache per length bin.
pub struct Unpacked {
    pub root: PathBuf,
    pub meta: CacheMeta,
    /// Bin k's sub-cache (`bin_KK/`), whose `seqlen` is the bin's bound.
    pub bins: Vec<Arc<Cache>>,
    pub infos: Vec<BinInfo>,
    /// sha256 of every bin's manifest and the recipe: names the cache's content.
    pub fingerprint: String,
    /// Batch buffers handed back by the arrays they became, for the next batches (as a
    /// `Cache`'s, `buffers.rs`).
    pub buffers: Arc<BufferPool>,
}

impl std::fmt::Debug for Unpacked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Unpacked({}, {} bins)", self.root.display(), self.bins.len())
    }
}

impl Unpacked {
    /// Open and check tokshuf.json, every bin's manifest and (`check_files`) every shard's and
    /// sidecar's size.
    pub fn open(root: &Path, check_files: bool) -> Result<Unpacked> {
        let meta = read_meta_any(root, true)?;
        let mpath = root.join(META_NAME);
        let m: Metadata = serde_json::from_value(meta.raw.clone()).map_err(|e| Error::corrupt(&mpath, format!("unreadable: {e}")))?;
        if m.packing != Some(format::Packing::Unpacked) {
            return Err(Error::Config(format!("{}: not an unpacked (packing=\"none\") cache; open it with tokshuf.Cache", root.display())));
        }
        let infos = m.bins.clone().ok_or_else(|| Error::corrupt(&mpath, "\"bins\" missing"))?;
        if infos.is_empty() || infos.len() > MAX_BINS {
            return Err(Error::corrupt(&mpath, format!("{} bins, expected 1 to {MAX_BINS}", infos.len())));
        }
        if infos.windows(2).any(|w| w[0].max_len >= w[1].max_len)
            || infos[0].max_len == 0
            || infos.last().map(|b| b.max_len) != Some(meta.seqlen)
        {
            return Err(Error::corrupt(&mpath, "bin bounds must be positive, increasing and end at seqlen"));
        }
        let examples: u64 = infos.iter().map(|b| b.num_examples).sum();
        if examples != meta.num_contexts || infos.iter().map(|b| b.num_chunks).sum::<u64>() != meta.num_chunks {
            return Err(Error::corrupt(&mpath, "the bins' examples or chunks do not add up to num_contexts / num_chunks"));
        }
        let mut h = Sha256::new();
        h.update(b"tokshuf-unpacked-v1\0");
        h.update(serde_json::to_string(&meta.raw["recipe"]).unwrap_or_default().as_bytes());
        let mut bins = Vec::with_capacity(infos.len());
        for (k, info) in infos.iter().enumerate() {
            let dir = format::bin_dir(root, k);
            let path = dir.join(MANIFEST_NAME);
            let text = read_manifest_text(&path)?;
            let chunks = parse_manifest_all(&path, &text, meta.chunk_size)?;
            let total: u64 = chunks.iter().map(|c| c.size).sum();
            if chunks.len() as u64 != info.num_chunks || total != info.num_examples {
                return Err(Error::corrupt(
                    &path,
                    format!("{} chunks of {total} examples, tokshuf.json says {} of {}", chunks.len(), info.num_chunks, info.num_examples),
                ));
            }
            if meta.shuffle {
                if let Some(c) = chunks.iter().take(chunks.len().saturating_sub(1)).position(|c| c.size != meta.chunk_size) {
                    return Err(Error::corrupt(&path, format!("line {}: only the last chunk of a bin may be short", c + 1)));
                }
            }
            if check_files {
                check_shards_of(&dir, &chunks)?;
            }
            h.update(format!("\0bin {k} {}\0", info.max_len).as_bytes());
            h.update(&*text);
            let bin_meta = CacheMeta {
                seqlen: info.max_len,
                num_chunks: info.num_chunks,
                num_contexts: info.num_examples,
                chunk_sizes: None,
                ragged: true,
                ..meta.clone()
            };
            // A bin's own fingerprint: the recipe, the bin and its manifest.
            let mut own = Sha256::new();
            own.update(b"tokshuf-unpacked-bin-v1\0");
            own.update(serde_json::to_string(&meta.raw["recipe"]).unwrap_or_default().as_bytes());
            own.update(format!("\0bin {k} {}\0", info.max_len).as_bytes());
            own.update(&*text);
            bins.push(Arc::new(Cache::from_parts(&dir, bin_meta, chunks, Some(format::hex(&own.finalize())), None)));
        }
        Ok(Unpacked {
            root: root.to_path_buf(),
            meta,
            bins,
            infos,
            fingerprint: format::hex(&h.finalize()),
            buffers: Arc::new(BufferPool::new()),
        })
    }

    pub fn seqlen(&self) -> usize {
        self.meta.seqlen as usize
    }

    /// R* when none is given: tokshuf.json `ideal_readers`, else min(64, chunks of the largest bin).
    pub fn default_ideal_readers(&self) -> u64 {
        self.meta.ideal_readers.unwrap_or_else(|| self.bins.iter().map(|b| b.chunks.len() as u64).max().unwrap_or(1).clamp(1, 64))
    }
}

/// How a batch of an unpacked cache is padded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PadTo {
    /// The longest example of the global batch.
    Longest,
    /// The bound of the batch's bin.
    Bin,
}

impl std::str::FromStr for PadTo {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "longest" => Ok(PadTo::Longest),
            "bin" => Ok(PadTo::Bin),
            _ => Err(Error::Config(format!("pad_to={s:?}: expected \"longest\" or \"bin\""))),
        }
    }
}

/// One rank's slice of one global batch of an unpacked cache.
#[derive(Debug)]
pub struct UnpackedBatch {
    /// `rows x width` ids, row-major, each row padded with `pad_id` after its `lengths[row]` ids.
    pub ids: Batch,
    pub rows: usize,
    pub width: usize,
    pub lengths: Vec<u32>,
    /// `rows x width`, true on real ids: made by the read threads rather than the consumer.
    pub mask: Vec<bool>,
    /// The bin the batch came from, and the bin's own batch counter.
    pub bin: usize,
    pub bin_batch: u64,
    /// Real ids of the whole global batch (all ranks).
    pub global_tokens: u64,
}

/// Everything that defines what a rank reads from an unpacked cache.
pub struct UnpackedSpec {
    pub cache: Arc<Unpacked>,
    schedule: Schedule,
    /// Bin of each schedule component (the non-empty bins, in order).
    drawn: Vec<usize>,
    /// Each bin's §6 order (None for an empty bin).
    orders: Vec<Option<Arc<dyn Source>>>,
    pub batch_size: u64,
    pub rank: u64,
    pub world_size: u64,
    pub dtype: OutDtype,
    pub pad_to: PadTo,
    pad_id: u32,
    description: String,
    reserved: Reservation,
}

impl Drop for UnpackedSpec {
    fn drop(&mut self) {
        self.cache.buffers.reserve(&self.reserved, 0);
    }
}

impl UnpackedSpec {
    pub fn new(
        cache: Arc<Unpacked>,
        opts: OrderOptions,
        batch_size: u64,
        rank: u64,
        world_size: u64,
        dtype: OutDtype,
        pad_to: PadTo,
    ) -> Result<UnpackedSpec> {
        if world_size == 0 || rank >= world_size {
            return Err(Error::Config(format!("rank {rank} out of range for world_size {world_size}")));
        }
        if batch_size == 0 || batch_size % world_size != 0 {
            return Err(Error::Config(format!("batch_size {batch_size} must be a positive multiple of world_size {world_size}")));
        }
        if opts.ideal_readers == 0 {
            return Err(Error::Config("ideal_readers must be positive".into()));
        }
        super::cache::holds_ids(dtype.size(), cache.meta.dtype)?;
        let (rows, seqlen) = (batch_size / world_size, cache.seqlen());
        crate::memory::check_fits(batch_bytes(batch_size, rows, seqlen, dtype), || {
            format!("a batch of {rows} rows of up to {seqlen} ids (batch_size {batch_size}, world_size {world_size})")
        })?;
        let drawn: Vec<usize> = (0..cache.bins.len()).filter(|&k| cache.infos[k].num_examples > 0).collect();
        if drawn.is_empty() {
            return Err(Error::Config(format!("{}: cache holds no examples", cache.root.display())));
        }
        let weights: Vec<f64> = drawn.iter().map(|&k| cache.infos[k].num_examples as f64).collect();
        let schedule = Schedule::new(&weights, DEFAULT_QUANTUM)?;
        let orders =
            cache.bins.iter().map(|b| (!b.is_empty()).then(|| cache_source(&b.sizes(), b.meta.chunk_size, 1, opts, false))).collect();
        let description = format!("unpacked-v1 q={:?} {}", schedule.quanta(), super::order::describe(cache.meta.chunk_size, opts, false));
        let pad_id = cache.meta.raw.get("pad_id").and_then(serde_json::Value::as_u64).unwrap_or(0) as u32;
        Ok(UnpackedSpec {
            cache,
            schedule,
            drawn,
            orders,
            batch_size,
            rank,
            world_size,
            dtype,
            pad_to,
            pad_id,
            description,
            reserved: Reservation::default(),
        })
    }

    /// What defines the sequence besides the cache (mixed into state fingerprints).
    pub fn describe(&self) -> String {
        self.description.clone()
    }

    /// The bin of global batch `b`, and that bin's own batch counter.
    pub fn bin_of(&self, b: u64) -> (usize, u64) {
        let (k, beta) = self.schedule.locate(b);
        (self.drawn[k], beta)
    }

    /// Bin and location in the bin of global example `m`.
    pub fn locate(&self, m: u64) -> Result<(usize, Loc)> {
        if m >= MAX_EXAMPLE {
            return Err(Error::Config(format!("example index {m} is too large (limit 2^62)")));
        }
        let (k, beta) = self.bin_of(m / self.batch_size);
        let order = self.orders[k].as_ref().ok_or_else(|| Error::Config("internal error: an empty bin was drawn".into()))?;
        Ok((k, order.locate(beta * self.batch_size + m % self.batch_size)))
    }

    /// This rank's slice of the global batch starting at example `first` (a multiple of B).
    pub fn assemble(&self, first: u64) -> Result<UnpackedBatch> {
        let b = self.batch_size;
        if first % b != 0 {
            return Err(Error::Config(format!(
                "example {first} does not start a batch: an unpacked cache's batches each come from one bin, \
                 so reading starts at a multiple of batch_size {b}"
            )));
        }
        if first.saturating_add(b) > MAX_EXAMPLE {
            return Err(Error::Config(format!("example index {first} is too large (limit 2^62)")));
        }
        let (k, beta) = self.bin_of(first / b);
        let cache = &self.cache.bins[k];
        let order = self.orders[k].as_ref().ok_or_else(|| Error::Config("internal error: an empty bin was drawn".into()))?;
        let locs: Vec<(u64, u64)> = (0..b).map(|j| order.locate(beta * b + j)).map(|l| (l.chunk, l.index)).collect();
        let mine: Vec<usize> = (self.rank..b).step_by(self.world_size as usize).map(|j| j as usize).collect();
        let (dtype, size, pad) = (cache.meta.dtype, cache.meta.dtype.size(), self.pad_id);
        let pool = &self.cache.buffers;
        pool.reserve_unless_reading_ahead(&self.reserved);
        // Every example of the global batch is found (its length counts, and sets the width),
        // the rank's own rows copied: one lookup of each member, whole rows widened at once.
        let (ids, lens, width, lengths) = cache.with_ragged(&locs, |members| {
            let lens: Vec<usize> = members.iter().map(|m| m.len() / size).collect();
            let width = match self.pad_to {
                PadTo::Longest => lens.iter().copied().max().unwrap_or(0),
                PadTo::Bin => cache.seqlen(),
            };
            let rows: Vec<&[u8]> = mine.iter().map(|&j| members[j]).collect();
            let ids = match self.dtype {
                OutDtype::U16 => Batch::U16(pad_rows(pool.take(rows.len() * width), dtype, &rows, width, pad)),
                OutDtype::U32 => Batch::U32(pad_rows(pool.take(rows.len() * width), dtype, &rows, width, pad)),
                OutDtype::I32 => Batch::I32(pad_rows(pool.take(rows.len() * width), dtype, &rows, width, pad)),
                OutDtype::I64 => Batch::I64(pad_rows(pool.take(rows.len() * width), dtype, &rows, width, pad)),
            };
            let lengths = mine.iter().map(|&j| lens[j] as u32).collect::<Vec<_>>();
            (ids, lens, width, lengths)
        })?;
        let rows = mine.len();
        // Each byte written once (not zeroed first, then set).
        let mut mask: Vec<bool> = Vec::with_capacity(rows * width);
        for &n in &lengths {
            mask.extend(std::iter::repeat_n(true, n as usize));
            mask.extend(std::iter::repeat_n(false, width - n as usize));
        }
        let global_tokens = lens.iter().map(|&n| n as u64).sum();
        Ok(UnpackedBatch { ids, rows, width, lengths, mask, bin: k, bin_batch: beta, global_tokens })
    }
}

/// `rows` (raw ids of `dtype`, each at most `width` of them) as a `rows x width` array in
/// `out` (empty, with room for it), each row padded with `pad`.
fn pad_rows<T: Id>(mut out: Vec<T>, dtype: Dtype, rows: &[&[u8]], width: usize, pad: u32) -> Vec<T> {
    let n = rows.len() * width;
    debug_assert!(out.is_empty() && out.capacity() >= n);
    if width > 0 {
        for (raw, row) in rows.iter().zip(out.spare_capacity_mut()[..n].chunks_exact_mut(width)) {
            let len = raw.len() / dtype.size();
            copy_ids(dtype, raw, &mut row[..len]);
            for x in &mut row[len..] {
                x.write(T::from_id(pad));
            }
        }
    }
    // SAFETY: every element of every row was written above (ids, then padding).
    unsafe { out.set_len(n) };
    out
}

impl Assemble for UnpackedSpec {
    type Out = UnpackedBatch;
    fn batch_size(&self) -> u64 {
        self.batch_size
    }
    fn batch_bytes(&self) -> Option<u64> {
        batch_bytes(self.batch_size, self.batch_size / self.world_size, self.cache.seqlen(), self.dtype)
    }
    fn assemble_at(&self, first: u64, _cancel: &AtomicBool) -> Result<Option<UnpackedBatch>> {
        self.assemble(first).map(Some)
    }
    fn in_flight(&self, batches: usize) {
        self.cache.buffers.reserve(&self.reserved, batches);
    }
}

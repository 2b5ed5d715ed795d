//! The contexts of one mapped shard, in each member format (DESIGN §3, docs/format.md §3):
//! `npy` and `blocks` rows sit at fixed offsets of the tar; `json.gz` members are inflated and
//! parsed; `blocks.zst` members are decoded a whole block at a time (into `BlockCache`).
//! Every row is written straight into the caller's (uninitialized) output.

use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::path::Path;
use std::sync::Arc;

use memmap2::Mmap;

use super::block_cache::{BlockCache, Decoded};
use super::id_list::parse_id_list;
use super::members::{copy_ids, header_name_is, index_members, member_size, Id};
use super::validate::ChunkEntry;
use crate::error::{Error, Result};
use crate::format::{self, Blocking, Dtype, Format, TAR_BLOCK};

/// A shard ready to read.
pub(super) enum Chunk {
    /// `npy`, `blocks`: rows at fixed offsets. `n` contexts.
    Fixed { map: Mmap, n: u64 },
    /// `json.gz`, `blocks.zst`: each member's data range. `n` contexts.
    Indexed { map: Mmap, members: Vec<(usize, usize)>, n: u64 },
    /// `npy` members of their own lengths (a bin of an unpacked cache), found through the
    /// shard's `.idx` sidecar (`format::idx`).
    Ragged { map: Mmap, idx: Vec<u8> },
}

/// What reading any shard of a cache needs: its member format and geometry.
#[derive(Clone, Debug)]
pub struct Layout {
    pub format: Format,
    pub dtype: Dtype,
    pub seqlen: u64,
    /// `npy`: the member header and the distance between members.
    npy_header: Vec<u8>,
    npy_stride: u64,
    /// Block formats; and for `blocks`, where a full block's rows start in its member and the
    /// distance between members (computed once: every row read needs them).
    blocking: Option<Blocking>,
    block_rows_at: u64,
    block_stride: u64,
    /// `npy` members of their own lengths, at most `seqlen` ids, with `.idx` sidecars.
    ragged: bool,
}

thread_local! {
    static INFLATE: RefCell<libdeflater::Decompressor> = RefCell::new(libdeflater::Decompressor::new());
    static INFLATED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    static UNZSTD: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

impl Layout {
    pub fn new(format: Format, dtype: Dtype, seqlen: u64, block_size: Option<u64>) -> Layout {
        let blocking =
            format.is_blocked().then(|| Blocking { block_size: block_size.unwrap_or(format::DEFAULT_BLOCK_SIZE), seqlen, dtype });
        Layout {
            format,
            dtype,
            seqlen,
            npy_header: format::npy_header(dtype, seqlen),
            npy_stride: format::npy_stride(dtype, seqlen),
            blocking,
            block_rows_at: blocking.map_or(0, |b| TAR_BLOCK + b.header(b.block_size).len() as u64),
            block_stride: blocking.map_or(0, |b| b.stride()),
            ragged: false,
        }
    }

    /// The layout of an unpacked cache's bins when `ragged` (`seqlen` is then the bin's bound).
    pub fn ragged(self, ragged: bool) -> Layout {
        Layout { ragged, ..self }
    }

    /// Contexts per member (1 but for block formats).
    pub fn block_size(&self) -> u64 {
        self.blocking.map_or(1, |b| b.block_size)
    }

    /// Bytes of one context's ids.
    fn row_bytes(&self) -> usize {
        self.seqlen as usize * self.dtype.size()
    }

    /// Bytes of a decoded full block (sizes the block cache).
    pub(super) fn block_bytes(&self) -> usize {
        self.blocking.map_or(0, |b| b.array_bytes(b.block_size) as usize)
    }

    /// Check a shard's size against what `entry` says it holds (no data is read).
    pub fn check_size(&self, path: &Path, entry: &ChunkEntry, len: u64) -> Result<()> {
        if let Some(b) = entry.bytes {
            if b != len {
                return Err(Error::corrupt(path, format!("size {len} bytes, manifest says {b} (truncated or changed?)")));
            }
        }
        let exact = match (self.format, self.blocking) {
            (Format::Npy, _) if self.ragged => None,
            (Format::Npy, _) => Some(entry.size * self.npy_stride + 2 * TAR_BLOCK),
            (Format::Blocks, Some(b)) => Some(b.shard_bytes(entry.size)),
            _ => None,
        };
        match exact {
            Some(want) if len != want => {
                Err(Error::corrupt(path, format!("size {len} bytes, expected {want} for {} contexts (truncated or changed?)", entry.size)))
            }
            Some(_) => Ok(()),
            None => {
                let members = entry.size.div_ceil(self.block_size());
                if len < (members * 2 + 2) * TAR_BLOCK || len % TAR_BLOCK != 0 {
                    return Err(Error::corrupt(
                        path,
                        format!("size {len} bytes cannot hold {members} {} members (truncated?)", self.format.name()),
                    ));
                }
                Ok(())
            }
        }
    }

    /// Check a freshly mapped shard (size, and the headers a reader relies on) and index it.
    pub(super) fn open(&self, path: &Path, c: u64, entry: &ChunkEntry, map: Mmap) -> Result<Chunk> {
        self.check_size(path, entry, map.len() as u64)?;
        let n = entry.size;
        match (self.format, self.blocking) {
            (Format::Npy, _) if self.ragged => {
                let ipath = path.with_extension("idx");
                let idx = std::fs::read(&ipath).map_err(|e| Error::corrupt(&ipath, format!("cannot read the shard's index: {e}")))?;
                format::idx::check(&ipath, &idx, n, map.len() as u64)?;
                Ok(Chunk::Ragged { map, idx })
            }
            (Format::Npy, _) => {
                for i in [0, n - 1] {
                    self.check_member(path, &map, c, i, i * self.npy_stride, &self.npy_header)?;
                }
                Ok(Chunk::Fixed { map, n })
            }
            (Format::Blocks, Some(b)) => {
                let last = b.blocks(n) - 1;
                for k in [0, last] {
                    self.check_member(path, &map, c, k, k * b.stride(), &b.header(b.rows(n, k)))?;
                }
                Ok(Chunk::Fixed { map, n })
            }
            _ => {
                let members = index_members(path, &map, c, n.div_ceil(self.block_size()), self.format)?;
                Ok(Chunk::Indexed { map, members, n })
            }
        }
    }

    /// Member `i` at byte `at` has its expected name and npy header.
    fn check_member(&self, path: &Path, map: &[u8], c: u64, i: u64, at: u64, npy: &[u8]) -> Result<()> {
        let at = at as usize;
        let name = format::member_name(c, i, self.format);
        if !header_name_is(&map[at..at + TAR_BLOCK as usize], name.as_bytes()) {
            return Err(Error::corrupt(path, format!("member {i} is not named {name:?}: not the fixed-stride layout")));
        }
        let data = at + TAR_BLOCK as usize;
        if map[data..data + npy.len()] != *npy {
            return Err(Error::corrupt(path, format!("member {name}: npy header differs from the cache's dtype/seqlen")));
        }
        Ok(())
    }

    /// Byte offset of context `i`'s ids in a `Fixed` chunk of `n` contexts.
    fn fixed_at(&self, n: u64, i: u64) -> usize {
        match self.blocking {
            None => (i * self.npy_stride + TAR_BLOCK) as usize + self.npy_header.len(),
            Some(b) => {
                let (k, r) = (i / b.block_size, i % b.block_size);
                let rows = b.rows(n, k);
                // Only a chunk's last block may be short, its header then of another length.
                let rows_at = if rows == b.block_size { self.block_rows_at } else { TAR_BLOCK + b.header(rows).len() as u64 };
                (k * self.block_stride + rows_at + r * self.row_bytes() as u64) as usize
            }
        }
    }

    /// The ids of context `i` as stored, where a chunk holds them as they are (`npy`, `blocks`).
    pub(super) fn fixed_row<'m>(&self, chunk: &'m Chunk, i: u64) -> Option<&'m [u8]> {
        match chunk {
            Chunk::Fixed { map, n } => {
                let at = self.fixed_at(*n, i);
                Some(&map[at..at + self.row_bytes()])
            }
            _ => None,
        }
    }

    /// Write context `i` of chunk `c` into `out` (one row).
    pub(super) fn read_row<T: Id>(
        &self,
        chunk: &Chunk,
        path: &Path,
        c: u64,
        i: u64,
        blocks: Option<&BlockCache>,
        out: &mut [MaybeUninit<T>],
    ) -> Result<()> {
        let rb = self.row_bytes();
        match chunk {
            Chunk::Fixed { .. } => {
                copy_ids(self.dtype, self.fixed_row(chunk, i).unwrap_or_default(), out);
                Ok(())
            }
            Chunk::Ragged { .. } => Err(Error::Config("internal error: rows of fixed length read from an unpacked cache".into())),
            Chunk::Indexed { map, members, n } => match (self.format, self.blocking, blocks) {
                (Format::BlocksZst, Some(b), Some(cache)) => {
                    let (k, r) = (i / b.block_size, i % b.block_size);
                    let block = cache.get(c, k, || self.decode_block(map, members, *n, c, k)).map_err(|e| Error::corrupt(path, e))?;
                    // A decoded block is its npy header, then its rows.
                    let at = block.len() - (b.rows(*n, k) - r) as usize * rb;
                    copy_ids(self.dtype, &block[at..at + rb], out);
                    Ok(())
                }
                _ => {
                    let (start, len) = members[i as usize];
                    let name = format::member_name(c, i, Format::JsonGz);
                    self.read_json_gz(&map[start..start + len], out).map_err(|e| Error::corrupt(path, format!("member {name}: {e}")))
                }
            },
        }
    }

    /// Member `index` of a `Ragged` chunk: its ids' bytes and their number, checked against the
    /// member's tar and npy headers.
    pub(super) fn ragged_member<'m>(&self, chunk: &'m Chunk, path: &Path, c: u64, index: u64) -> Result<(&'m [u8], usize)> {
        let Chunk::Ragged { map, idx } = chunk else {
            return Err(Error::Config("internal error: an example of its own length read from a cache of fixed-length contexts".into()));
        };
        // The name and header are checked in place, without allocating: this runs for every
        // example an unpacked reader reads.
        let mut name_buf = [0u8; 48];
        let mut w = &mut name_buf[..];
        format::write_member_name(&mut w, c, index, Format::Npy).expect("a member name fits in 48 bytes");
        let name_len = 48 - w.len();
        let name = || format::member_name(c, index, Format::Npy);
        let (start, end) = (format::idx::offset(idx, index) as usize, format::idx::offset(idx, index + 1) as usize);
        let header = &map[start..start + TAR_BLOCK as usize];
        if !header_name_is(header, &name_buf[..name_len]) {
            return Err(Error::corrupt(path, format!("member {index} is not named {:?} where the index says", name())));
        }
        let size = member_size(header).ok_or_else(|| Error::corrupt(path, format!("member {}: unreadable size", name())))?;
        let data_at = start + TAR_BLOCK as usize;
        let data = map.get(data_at..data_at + size).filter(|_| data_at + size <= end);
        let data = data.ok_or_else(|| Error::corrupt(path, format!("member {}: size {size} runs past the next member", name())))?;
        let dsize = self.dtype.size();
        let hlen = if data.len() >= 10 && data.starts_with(b"\x93NUMPY\x01\x00") {
            10 + u16::from_le_bytes([data[8], data[9]]) as usize
        } else {
            usize::MAX
        };
        let len = size.saturating_sub(hlen) / dsize;
        let mut want = [0u8; 128];
        let want_len = format::npy_header_into(self.dtype, len as u64, &mut want);
        if hlen > size || (size - hlen) % dsize != 0 || len as u64 > self.seqlen || data[..hlen] != want[..want_len] {
            return Err(Error::corrupt(
                path,
                format!("member {}: not a 1-D npy array of at most {} ids of the cache's dtype", name(), self.seqlen),
            ));
        }
        Ok((&data[hlen..], len))
    }

    /// Inflate one `json.gz` member and parse its ids into `out`.
    fn read_json_gz<T: Id>(&self, gz: &[u8], out: &mut [MaybeUninit<T>]) -> std::result::Result<(), String> {
        // The gzip trailer ends with the inflated size (mod 2^32): allocate exactly that, after
        // checking it against the longest list of `seqlen` ids there can be.
        let limit = self.seqlen as usize * 11 + 64;
        let size = match gz.len().checked_sub(4).map(|at| &gz[at..]) {
            Some(t) => u32::from_le_bytes([t[0], t[1], t[2], t[3]]) as usize,
            None => return Err("bad gzip data: too short".into()),
        };
        if size > limit {
            return Err(format!("bad gzip data: {size} bytes inflated, a list of {} ids takes at most {limit}", self.seqlen));
        }
        let max = match self.dtype {
            Dtype::Uint16 => u16::MAX as u64,
            Dtype::Uint32 => u32::MAX as u64,
        };
        INFLATED.with_borrow_mut(|text| {
            text.resize(size, 0);
            let got = INFLATE.with_borrow_mut(|d| d.gzip_decompress(gz, text)).map_err(|e| format!("bad gzip data: {e:?}"))?;
            if got != size {
                return Err(format!("bad gzip data: inflated {got} bytes, the trailer says {size}"));
            }
            parse_id_list(&text[..got], max, out)
        })
    }

    /// Decode member `k` of a `blocks.zst` chunk: the npy file of its block, header checked.
    fn decode_block(&self, map: &[u8], members: &[(usize, usize)], n: u64, c: u64, k: u64) -> Decoded {
        let b = self.blocking.ok_or("not a block format")?;
        let name = format::member_name(c, k, self.format);
        let (start, len) = *members.get(k as usize).ok_or_else(|| format!("member {name} is missing"))?;
        let rows = b.rows(n, k);
        let want = b.array_bytes(rows) as usize;
        // Room for one byte more than expected: a longer frame fails instead of being cut.
        let mut out = Vec::with_capacity(want + 1);
        UNZSTD
            .with_borrow_mut(|d| {
                if d.is_none() {
                    *d = Some(zstd::bulk::Decompressor::new()?);
                }
                match d {
                    Some(d) => d.decompress_to_buffer(&map[start..start + len], &mut out),
                    None => Ok(0),
                }
            })
            .map_err(|e| format!("member {name}: bad zstd data: {e}"))?;
        if out.len() != want || !out.starts_with(&b.header(rows)) {
            return Err(format!("member {name}: not the npy array of {rows} contexts of {} ids the cache's layout implies", self.seqlen));
        }
        Ok(Arc::new(out))
    }
}

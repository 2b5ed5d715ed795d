//! The global example order of DESIGN §6, as O(log S) random access (S = number of short chunks).
//!
//! Definitions (this is the documented contract of the reader):
//! - N chunks, chunk c holds n_c contexts, `chunk_size` CS. A chunk is *full* when n_c == CS and
//!   *short* when n_c < CS: at most the last chunk of a shuffled cache, one per input file in a
//!   `shuffle=False` cache (their sizes are tokshuf.json `chunk_sizes`).
//! - Chunk positions p = 0, 1, 2, ...; epoch e = p div N; the chunk at p is π_e(p mod N).
//!   π_0 is the identity, and so is σ_{0,c} (contexts inside chunk c in tar order).
//! - For e >= 1 with `reshuffle`: π_e permutes only the full chunks among the full positions
//!   (short chunks keep their positions), as `hash::Permutation` over the full ranks keyed by
//!   `combine(combine(DOMAIN_CHUNK_PERM, seed), e)`; σ_{e,c} permutes the contexts of chunk c,
//!   keyed by `combine(combine(combine(DOMAIN_CONTEXT_PERM, seed), e), c)`. Without `reshuffle`
//!   every π_e and σ_{e,c} is the identity.
//! - A cache whose members are compressed blocks of B contexts (`blocks.zst`) is read a block at
//!   a time, so there σ_{e,c} keeps blocks together: it permutes the chunk's full blocks
//!   (keyed by `combine(key, DOMAIN_BLOCKS)`) and the contexts inside each block (keyed by
//!   `combine(combine(key, DOMAIN_ROWS), block)`), a short last block staying last. Within an
//!   epoch a stream then decodes each block once instead of once per context.
//! - Stream r (0 <= r < R*) takes positions r, r+R*, r+2R*, ...; `example[i]` is context
//!   i div R* of the concatenation of stream (i mod R*)'s chunks.
//!
//! Why short chunks keep their positions: the number of contexts at position p then depends on
//! p mod N only, never on the epoch. Stream r visits positions q_t = (r + t R*) mod N, which
//! repeat with period T = N / g, g = gcd(N, R*), and hold P_r = T·CS − (deficits of the short
//! positions it visits) contexts per period. Short position s is visited by stream r iff
//! s ≡ r (mod g), at step t_s = ((s − r)/g) · inv(R*/g mod T) mod T. Streams of one residue
//! class ρ = r mod g see the same short positions, at steps rotated by δ = ((r − ρ)/g) · inv;
//! so one table per class (steps sorted, prefix sums of deficits), built once in O(S log S),
//! serves every stream by a binary search over the rotated list. Nothing grows with the number
//! of examples or epochs: locating example 10^12 costs what locating example 1 does.
//!
//! Single pass (evaluation): example i is the i-th context in manifest order, i < total.
//!
//! R* defaults (in the reader) to tokshuf.json `ideal_readers` when present, else
//! min(64, number of chunks): any R* gives the same contract, but it must stay fixed for the life
//! of a training run (it is part of the reader's state fingerprint); 64 lets up to 64 ranks each
//! stream whole chunks early in an epoch, and never exceeding N avoids streams that revisit the
//! same chunks (which happens when R* > N, still correct).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::error::Result;

use crate::hash::{self, Permutation};

/// Where one example lives: context `index` (tar order) of chunk `chunk` of component
/// `component` (always 0 for a single cache; a blend names the cache).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Loc {
    pub component: usize,
    pub chunk: u64,
    pub index: u64,
}

/// An example sequence the reader can serve: example i -> its location. Implemented by the
/// §6 order of one cache (`Order`), the single pass over one cache (`SinglePass`), and blends.
pub trait Source: Send + Sync {
    /// Location of example `i` (i < 2^63, and i < `num_examples()` for a finite source).
    fn locate(&self, i: u64) -> Loc;
    /// Number of examples of a finite source; `None` for an endless one.
    fn num_examples(&self) -> Option<u64>;
    /// A string that changes whenever the sequence could change (mixed into state fingerprints;
    /// the chunk sizes are the cache fingerprint's part).
    fn describe(&self) -> String;
    /// `locate` of each of `examples`, appended to `out` in order. Sources whose examples
    /// share work per chunk (the §6 order) do it once per chunk.
    fn locate_many(&self, examples: &[u64], out: &mut Vec<Loc>) {
        out.extend(examples.iter().map(|&i| self.locate(i)));
    }
    /// `locate`, for sources that may have to wait for a running build (follow mode).
    fn locate_wait(&self, i: u64, _cancel: &AtomicBool) -> Result<Loc> {
        Ok(self.locate(i))
    }
    /// A finite source whose length is not known yet (a single pass following a build).
    fn len_pending(&self) -> bool {
        false
    }
    /// Wait until the source is known to hold at least `n` examples (`None`, also for an
    /// endless source) or its length is known (`Some(len)`).
    fn wait_len(&self, _n: u64, _cancel: &AtomicBool) -> Result<Option<u64>> {
        Ok(self.num_examples())
    }
}

/// `Source::describe` of a cache's order: the options that define it (N and the chunk sizes
/// are left to the cache fingerprint, so that a reader following a build describes its order
/// before N is known exactly as a reader of the finished cache does).
pub fn describe(chunk_size: u64, opts: OrderOptions, single_pass: bool) -> String {
    if single_pass {
        "single-pass-v1".into()
    } else {
        format!("order-v1 r*={} seed={} reshuffle={} cs={chunk_size}", opts.ideal_readers, opts.seed, opts.reshuffle)
    }
}

/// Options that, with the chunk sizes, define the order (all part of a reader's fingerprint).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OrderOptions {
    pub ideal_readers: u64,
    pub seed: u64,
    pub reshuffle: bool,
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Inverse of `a` modulo `m` (gcd(a, m) == 1, m >= 1); 0 when m == 1.
fn mod_inverse(a: u64, m: u64) -> u64 {
    if m == 1 {
        return 0;
    }
    let (mut old_r, mut r) = (a as i128 % m as i128, m as i128);
    let (mut old_s, mut s) = (1i128, 0i128);
    while r != 0 {
        let q = old_r / r;
        (old_r, r) = (r, old_r - q * r);
        (old_s, s) = (s, old_s - q * s);
    }
    debug_assert_eq!(old_r, 1);
    old_s.rem_euclid(m as i128) as u64
}

#[inline]
fn mul_mod(a: u64, b: u64, m: u64) -> u64 {
    ((a as u128 * b as u128) % m as u128) as u64
}

/// One short position as seen from the base stream of its residue class.
#[derive(Clone, Copy, Debug)]
struct Short {
    class: u64,
    /// Step at which the class's base stream (r = class) visits it, in 0..T.
    step: u64,
    size: u64,
}

/// The endless order of DESIGN §6 over one cache's chunks.
#[derive(Debug)]
pub struct Order {
    n: u64,
    cs: u64,
    r_star: u64,
    seed: u64,
    reshuffle: bool,
    g: u64,
    period: u64,
    inv: u64,
    /// Short chunk positions, ascending, with their sizes.
    short_pos: Vec<u64>,
    short_size: Vec<u64>,
    /// Shorts sorted by (class, step), and prefix sums of their deficits (len + 1).
    table: Vec<Short>,
    deficit_prefix: Vec<u64>,
    /// Contexts per block that σ keeps together (1: any context may go anywhere).
    block: u64,
    fingerprint: String,
}

/// Domains of the two permutations of a block-preserving σ.
const DOMAIN_BLOCKS: u64 = 0x626C6F636B73;
const DOMAIN_ROWS: u64 = 0x726F7773;

/// Image of `off` under the block-preserving permutation (keyed by `key`) of a chunk of `n`
/// contexts in blocks of `block`: full blocks are permuted among themselves, then contexts
/// within their block; the short last block (if any) stays last.
fn block_permute(n: u64, block: u64, key: u64, off: u64) -> u64 {
    let full = n / block;
    let (b, r, rows) = if off < full * block { (off / block, off % block, block) } else { (full, off - full * block, n - full * block) };
    let to = if b < full { Permutation::new(full, hash::combine(key, DOMAIN_BLOCKS)).apply(b) } else { b };
    to * block + Permutation::new(rows, hash::combine(hash::combine(key, DOMAIN_ROWS), to)).apply(r)
}

impl Order {
    /// `sizes[c]` = contexts of chunk c (1..=chunk_size, validated by the cache).
    pub fn new(sizes: &[u64], chunk_size: u64, opts: OrderOptions) -> Order {
        let n = sizes.len() as u64;
        assert!(n > 0 && chunk_size > 0 && opts.ideal_readers > 0, "order of an empty cache");
        let r_star = opts.ideal_readers;
        let g = gcd(n, r_star);
        let period = n / g;
        let inv = mod_inverse((r_star / g) % period.max(1), period);
        let (mut short_pos, mut short_size) = (Vec::new(), Vec::new());
        for (c, &s) in sizes.iter().enumerate() {
            debug_assert!(s >= 1 && s <= chunk_size);
            if s < chunk_size {
                short_pos.push(c as u64);
                short_size.push(s);
            }
        }
        let mut table: Vec<Short> = short_pos
            .iter()
            .zip(&short_size)
            .map(|(&s, &size)| {
                let class = s % g;
                Short { class, step: mul_mod((s - class) / g, inv, period), size }
            })
            .collect();
        table.sort_unstable_by_key(|e| (e.class, e.step));
        let mut deficit_prefix = Vec::with_capacity(table.len() + 1);
        deficit_prefix.push(0u64);
        for e in &table {
            deficit_prefix.push(deficit_prefix.last().copied().unwrap_or(0) + (chunk_size - e.size));
        }
        let fingerprint = describe(chunk_size, opts, false);
        Order {
            n,
            cs: chunk_size,
            r_star,
            seed: opts.seed,
            reshuffle: opts.reshuffle,
            g,
            period,
            inv,
            short_pos,
            short_size,
            table,
            deficit_prefix,
            block: 1,
            fingerprint,
        }
    }

    /// σ keeps blocks of `block` contexts together (see the module doc); 1 changes nothing.
    pub fn with_blocks(mut self, block: u64) -> Order {
        if block > 1 {
            self.block = block;
            self.fingerprint = format!("{} block={block}", self.fingerprint);
        }
        self
    }

    pub fn ideal_readers(&self) -> u64 {
        self.r_star
    }

    /// (chunk position within its stream's list of chunks, offset) of stream-local example k
    /// of stream r: returns (t, offset) with the stream's t-th chunk position r + t R*.
    fn stream_step(&self, r: u64, k: u64) -> (u64, u64) {
        let class = r % self.g;
        let lo = self.table.partition_point(|e| e.class < class);
        let hi = self.table.partition_point(|e| e.class <= class);
        let m = hi - lo;
        let cs = self.cs;
        let per_period = self.period * cs - (self.deficit_prefix[hi] - self.deficit_prefix[lo]);
        let (periods, k) = (k / per_period, k % per_period);
        if m == 0 {
            return (periods * self.period + k / cs, k % cs);
        }
        // Rotate the class table to stream r: steps shift down by delta (mod T).
        let delta = mul_mod((r - class) / self.g, self.inv, self.period);
        let h = lo + self.table[lo..hi].partition_point(|e| e.step < delta);
        let total_def = self.deficit_prefix[hi] - self.deficit_prefix[lo];
        // v-th short of the rotated list: (step in this stream, size, deficits before it).
        let entry = |v: usize| -> (u64, u64, u64) {
            let j = lo + (h - lo + v) % m;
            let e = &self.table[j];
            if j >= h {
                (e.step - delta, e.size, self.deficit_prefix[j] - self.deficit_prefix[h])
            } else {
                (
                    e.step + self.period - delta,
                    e.size,
                    total_def - (self.deficit_prefix[h] - self.deficit_prefix[lo]) + (self.deficit_prefix[j] - self.deficit_prefix[lo]),
                )
            }
        };
        // Number of the stream's shorts whose first context comes at or before k.
        let start = |v: usize| {
            let (t, _, d) = entry(v);
            t * cs - d
        };
        let (mut a, mut b) = (0usize, m);
        while a < b {
            let mid = (a + b) / 2;
            if start(mid) <= k {
                a = mid + 1;
            } else {
                b = mid;
            }
        }
        let (t, off) = if a == 0 {
            (k / cs, k % cs)
        } else {
            let (t, size, _) = entry(a - 1);
            let s0 = start(a - 1);
            if k < s0 + size {
                (t, k - s0)
            } else {
                let rest = k - s0 - size;
                (t + 1 + rest / cs, rest % cs)
            }
        };
        (periods * self.period + t, off)
    }

    /// Chunk at position q (< N) in epoch e.
    fn chunk_at(&self, e: u64, q: u64) -> u64 {
        if e == 0 || !self.reshuffle {
            return q;
        }
        let shorts_before = self.short_pos.partition_point(|&s| s < q) as u64;
        if self.short_pos.get(shorts_before as usize) == Some(&q) {
            return q; // short chunks keep their positions
        }
        let nfull = self.n - self.short_pos.len() as u64;
        let key = hash::combine(hash::combine(hash::DOMAIN_CHUNK_PERM, self.seed), e);
        let k = Permutation::new(nfull, key).apply(q - shorts_before);
        // The k-th full position: k + #{shorts l : s_l - l <= k}.
        let mut lo = 0usize;
        let mut hi = self.short_pos.len();
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.short_pos[mid] - mid as u64 <= k {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        k + lo as u64
    }

    fn size_of(&self, c: u64) -> u64 {
        match self.short_pos.binary_search(&c) {
            Ok(j) => self.short_size[j],
            Err(_) => self.cs,
        }
    }

    /// Position, epoch-local chunk and in-chunk offset of example i (exposed for tests).
    pub fn position(&self, i: u64) -> (u64, u64) {
        let (r, k) = (i % self.r_star, i / self.r_star);
        let (t, off) = self.stream_step(r, k);
        (r + t * self.r_star, off)
    }
}

/// What one chunk position decides: its chunk, and how that chunk's contexts are permuted in
/// its epoch.
#[derive(Clone, Copy, Debug)]
struct AtPosition {
    chunk: u64,
    contexts: Contexts,
}

#[derive(Clone, Copy, Debug)]
enum Contexts {
    /// Epoch 0, or no reshuffle: tar order.
    InOrder,
    /// σ_{e,c}.
    Permuted(Permutation),
    /// σ_{e,c} of a block-preserving order: (chunk size, block, key).
    Blocks(u64, u64, u64),
}

impl AtPosition {
    #[inline]
    fn index(&self, off: u64) -> u64 {
        match self.contexts {
            Contexts::InOrder => off,
            Contexts::Permuted(p) => p.apply(off),
            Contexts::Blocks(n, block, key) => block_permute(n, block, key, off),
        }
    }
}

/// Slots of `Order::locate_many`'s memo of chunk positions: more than the positions one batch
/// spans in the usual case (R* streams, each at one or two positions).
const POSITION_MEMO: usize = 256;

impl Order {
    /// The chunk at global position p and the permutation of its contexts.
    fn at_position(&self, p: u64) -> AtPosition {
        let (e, q) = (p / self.n, p % self.n);
        let chunk = self.chunk_at(e, q);
        let contexts = if e == 0 || !self.reshuffle {
            Contexts::InOrder
        } else {
            let key = hash::combine(hash::combine(hash::combine(hash::DOMAIN_CONTEXT_PERM, self.seed), e), chunk);
            if self.block > 1 {
                Contexts::Blocks(self.size_of(chunk), self.block, key)
            } else {
                Contexts::Permuted(Permutation::new(self.size_of(chunk), key))
            }
        };
        AtPosition { chunk, contexts }
    }
}

impl Source for Order {
    fn locate(&self, i: u64) -> Loc {
        let (p, off) = self.position(i);
        let at = self.at_position(p);
        Loc { component: 0, chunk: at.chunk, index: at.index(off) }
    }
    fn locate_many(&self, examples: &[u64], out: &mut Vec<Loc>) {
        const NONE: u32 = u32::MAX;
        // Each position's chunk and permutation (an index into `perms`, or NONE).
        let mut memo: Vec<Option<(u64, AtPosition, u32)>> = vec![None; POSITION_MEMO];
        let mut perms = Vec::new();
        // Permuted contexts are found for the whole batch at once (`Permutation::apply_many`):
        // which permutation, the offset to permute, and the `out` entry it goes to.
        let (mut which, mut xs, mut dest) = (Vec::new(), Vec::new(), Vec::new());
        out.reserve(examples.len());
        for &i in examples {
            let (p, off) = self.position(i);
            let slot = &mut memo[(p % POSITION_MEMO as u64) as usize];
            let (at, perm) = match *slot {
                Some((q, at, perm)) if q == p => (at, perm),
                _ => {
                    let at = self.at_position(p);
                    let perm = match at.contexts {
                        Contexts::Permuted(permutation) => {
                            perms.push(permutation);
                            perms.len() as u32 - 1
                        }
                        _ => NONE,
                    };
                    *slot = Some((p, at, perm));
                    (at, perm)
                }
            };
            let index = if perm == NONE {
                at.index(off)
            } else {
                which.push(perm);
                xs.push(off);
                dest.push(out.len());
                off
            };
            out.push(Loc { component: 0, chunk: at.chunk, index });
        }
        Permutation::apply_many(&perms, &which, &mut xs);
        for (&d, &x) in dest.iter().zip(&xs) {
            out[d].index = x;
        }
    }
    fn num_examples(&self) -> Option<u64> {
        None
    }
    fn describe(&self) -> String {
        self.fingerprint.clone()
    }
}

/// The example source of one cache with chunk sizes `sizes`: its §6 order, or each context
/// once in manifest order for a single pass. `block`: see `Order::with_blocks`.
pub fn cache_source(sizes: &[u64], chunk_size: u64, block: u64, opts: OrderOptions, single_pass: bool) -> Arc<dyn Source> {
    if single_pass {
        Arc::new(SinglePass::new(sizes))
    } else {
        Arc::new(Order::new(sizes, chunk_size, opts).with_blocks(block))
    }
}

/// Each context once, in manifest order (evaluation).
#[derive(Debug)]
pub struct SinglePass {
    /// cumulative[c] = contexts before chunk c (len N + 1).
    cumulative: Arc<[u64]>,
}

impl SinglePass {
    pub fn new(sizes: &[u64]) -> SinglePass {
        let mut cumulative = Vec::with_capacity(sizes.len() + 1);
        let mut acc = 0u64;
        cumulative.push(0);
        for &s in sizes {
            acc += s;
            cumulative.push(acc);
        }
        SinglePass { cumulative: cumulative.into() }
    }
}

impl Source for SinglePass {
    fn locate(&self, i: u64) -> Loc {
        let c = self.cumulative.partition_point(|&x| x <= i) - 1;
        Loc { component: 0, chunk: c as u64, index: i - self.cumulative[c] }
    }
    fn num_examples(&self) -> Option<u64> {
        self.cumulative.last().copied()
    }
    fn describe(&self) -> String {
        "single-pass-v1".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_permutation_is_a_permutation_that_keeps_blocks_together() {
        for (n, block) in [(1u64, 4u64), (8, 4), (10, 4), (3, 4), (130, 64), (64, 64)] {
            for key in 0..5u64 {
                let img: Vec<u64> = (0..n).map(|off| block_permute(n, block, key, off)).collect();
                let mut sorted = img.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "n={n} block={block}");
                for (off, &to) in img.iter().enumerate() {
                    // Contexts of one source block land in one destination block.
                    let first = img[off / block as usize * block as usize];
                    assert_eq!(to / block, first / block);
                    if off as u64 >= n / block * block {
                        assert!(to >= n / block * block, "the short block stays last");
                    }
                }
            }
        }
        let sizes = [8u64, 8, 8, 3];
        let opts = OrderOptions { ideal_readers: 2, seed: 1, reshuffle: true };
        let (plain, blocked) = (Order::new(&sizes, 8, opts), Order::new(&sizes, 8, opts).with_blocks(4));
        assert_ne!(plain.describe(), blocked.describe());
        let epoch0 = |o: &Order| (0..20).map(|i| o.locate(i)).collect::<Vec<_>>();
        assert_eq!(epoch0(&plain), epoch0(&blocked), "epoch 0 is manifest order either way");
    }

    /// Straight walk over positions: the definition, for small i.
    fn brute(sizes: &[u64], cs: u64, opts: OrderOptions, count: u64) -> Vec<Loc> {
        let order = Order::new(sizes, cs, opts);
        let n = sizes.len() as u64;
        let r_star = opts.ideal_readers;
        let per_stream = count / r_star + 2;
        let mut streams: Vec<Vec<Loc>> = vec![Vec::new(); r_star as usize];
        for r in 0..r_star {
            let mut p = r;
            while (streams[r as usize].len() as u64) < per_stream {
                let (e, q) = (p / n, p % n);
                let c = order.chunk_at(e, q);
                let nc = sizes[c as usize];
                assert_eq!(nc, sizes[q as usize], "sizes depend on q only");
                for off in 0..nc {
                    let index = if e == 0 || !opts.reshuffle {
                        off
                    } else {
                        let key = hash::combine(hash::combine(hash::combine(hash::DOMAIN_CONTEXT_PERM, opts.seed), e), c);
                        Permutation::new(nc, key).apply(off)
                    };
                    streams[r as usize].push(Loc { component: 0, chunk: c, index });
                }
                p += r_star;
            }
        }
        (0..count).map(|i| streams[(i % r_star) as usize][(i / r_star) as usize]).collect()
    }

    #[test]
    fn matches_brute_force_walk() {
        let mut rng = hash::SplitMix64::new(1);
        for case in 0..300 {
            let n = 1 + rng.below(12);
            let cs = 1 + rng.below(6);
            let sizes: Vec<u64> = (0..n).map(|_| if rng.below(3) == 0 { 1 + rng.below(cs) } else { cs }).collect();
            let r_star = [1, 2, 3, 4, 6, 8, 12, 64][rng.below(8) as usize];
            let opts = OrderOptions { ideal_readers: r_star, seed: case, reshuffle: case % 4 != 0 };
            let total: u64 = sizes.iter().sum();
            let count = total * 4 + r_star * cs * 3;
            let order = Order::new(&sizes, cs, opts);
            let want = brute(&sizes, cs, opts, count);
            for (i, w) in want.iter().enumerate() {
                assert_eq!(order.locate(i as u64), *w, "case {case} sizes {sizes:?} cs {cs} r* {r_star} i {i}");
            }
        }
    }

    #[test]
    fn locate_many_is_locate_of_each() {
        let mut rng = hash::SplitMix64::new(5);
        for case in 0..200 {
            let n = 1 + rng.below(10);
            let cs = 1 + rng.below(9);
            let sizes: Vec<u64> = (0..n).map(|_| if rng.below(3) == 0 { 1 + rng.below(cs) } else { cs }).collect();
            let r_star = 1 + rng.below(70);
            let opts = OrderOptions { ideal_readers: r_star, seed: case, reshuffle: case % 5 != 0 };
            let order = Order::new(&sizes, cs, opts).with_blocks(1 + rng.below(4));
            // A rank's slice of consecutive batches (stride R), and indices far apart (positions
            // that share a memo slot).
            let stride = 1 + rng.below(8);
            let start = rng.below(1 << 40);
            let mut examples: Vec<u64> = (0..600).map(|j| start + j * stride).collect();
            examples.extend((0..50).map(|j| j * 256 * r_star + rng.below(r_star)));
            let mut got = Vec::new();
            order.locate_many(&examples, &mut got);
            let want: Vec<Loc> = examples.iter().map(|&i| order.locate(i)).collect();
            assert_eq!(got, want, "case {case}");
        }
    }

    #[test]
    fn each_epoch_is_a_permutation_of_contexts() {
        let sizes = [4u64, 4, 2, 4, 4, 3, 4];
        let order = Order::new(&sizes, 4, OrderOptions { ideal_readers: 1, seed: 9, reshuffle: true });
        let total: u64 = sizes.iter().sum();
        for e in 0..4 {
            let mut seen: Vec<Loc> = (e * total..(e + 1) * total).map(|i| order.locate(i)).collect();
            seen.sort_by_key(|l| (l.chunk, l.index));
            seen.dedup();
            assert_eq!(seen.len() as u64, total);
        }
    }

    #[test]
    fn huge_indices_do_not_overflow() {
        let sizes = [5u64, 5, 3, 5, 2];
        let order = Order::new(&sizes, 5, OrderOptions { ideal_readers: 64, seed: 1, reshuffle: true });
        for i in [1u64 << 40, 1 << 50, (1 << 62) + 12345, (1u64 << 63) - 1] {
            let l = order.locate(i);
            assert!(l.chunk < 5 && l.index < sizes[l.chunk as usize]);
        }
    }

    #[test]
    fn single_pass_is_manifest_order() {
        let sp = SinglePass::new(&[3, 1, 2]);
        let got: Vec<(u64, u64)> = (0..6).map(|i| sp.locate(i)).map(|l| (l.chunk, l.index)).collect();
        assert_eq!(got, vec![(0, 0), (0, 1), (0, 2), (1, 0), (2, 0), (2, 1)]);
        assert_eq!(sp.num_examples(), Some(6));
    }

    #[test]
    fn modular_inverse() {
        for m in 1..50u64 {
            for a in 1..m {
                if gcd(a, m) == 1 {
                    assert_eq!(mul_mod(a, mod_inverse(a, m), m), 1 % m);
                }
            }
        }
    }
}

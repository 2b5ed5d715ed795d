//! Version-stable hashing and randomness. Every randomized decision in tokshuf is a pure
//! function of the seed and small integer indices through these functions, so output never
//! depends on a dependency's RNG or on `std`'s hasher (both may change between versions).
//! Changing anything here changes every cache: the golden-hash tests pin it.

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// Domains keep the streams of different uses independent for the same seed.
pub const DOMAIN_CELL: u64 = 0x63656c6c; // "cell": which cell a context goes to
pub const DOMAIN_CELL_SHUFFLE: u64 = 0x73687566; // "shuf": Fisher-Yates inside a cell
pub const DOMAIN_CHUNK_PERM: u64 = 0x6368756e; // "chun": reader's per-epoch chunk order
pub const DOMAIN_CONTEXT_PERM: u64 = 0x63747870; // "ctxp": reader's per-epoch order inside a chunk

/// SplitMix64's output function (Steele, Lea, Flood 2014): a bijective 64-bit mixer.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Absorb one more word into a running hash.
#[inline]
pub fn combine(h: u64, x: u64) -> u64 {
    mix64(h ^ x.wrapping_add(GOLDEN).wrapping_mul(GOLDEN))
}

/// `h(seed, id)` of DESIGN §5: the cell of context `(file, pos)` is `cell_hash(..) % C`.
#[inline]
pub fn cell_hash(seed: u64, file: u64, pos: u64) -> u64 {
    combine(combine(combine(DOMAIN_CELL, seed), file), pos)
}

/// SplitMix64 generator: state advances by the golden gamma, output is `mix64(state)`.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN);
        mix64(self.state)
    }
    /// Uniform integer in `0..n` (n > 0), Lemire's multiply-and-reject: exact, no modulo bias.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        let mut m = (self.next_u64() as u128) * (n as u128);
        if (m as u64) < n {
            let threshold = n.wrapping_neg() % n;
            while (m as u64) < threshold {
                m = (self.next_u64() as u128) * (n as u128);
            }
        }
        (m >> 64) as u64
    }
}

/// Fisher-Yates (Durstenfeld) shuffle driven by `SplitMix64`.
pub fn fisher_yates<T>(items: &mut [T], rng: &mut SplitMix64) {
    for i in (1..items.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        items.swap(i, j);
    }
}

/// The generator that shuffles cell `cell` (DESIGN §5, stage 2).
pub fn cell_rng(seed: u64, cell: u64) -> SplitMix64 {
    SplitMix64::new(combine(combine(DOMAIN_CELL_SHUFFLE, seed), cell))
}

/// A seeded permutation of `0..n` evaluated one element at a time in O(1) memory and time:
/// a 4-round Feistel network over the smallest even-bit power of two >= n, with cycle walking
/// back into range. The reader uses it so that no per-epoch array is ever built.
#[derive(Clone, Copy, Debug)]
pub struct Permutation {
    n: u64,
    half_bits: u32,
    /// `combine(key, k)` of round k: the round function is `combine(round_keys[k], r)`.
    round_keys: [u64; 4],
}

impl Permutation {
    pub fn new(n: u64, key: u64) -> Self {
        let bits = 64 - n.saturating_sub(1).leading_zeros();
        let half_bits = bits.div_ceil(2).max(1);
        let round_keys = [0, 1, 2, 3].map(|k| combine(key, k));
        Permutation { n, half_bits, round_keys }
    }
    #[inline]
    fn round(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let (mut l, mut r) = (x >> self.half_bits, x & mask);
        for k in self.round_keys {
            let f = combine(k, r) & mask;
            (l, r) = (r, l ^ f);
        }
        (l << self.half_bits) | r
    }
    /// Image of `i` (< n).
    #[inline]
    pub fn apply(&self, i: u64) -> u64 {
        debug_assert!(i < self.n);
        if self.n <= 1 {
            return i;
        }
        let mut x = self.round(i);
        while x >= self.n {
            x = self.round(x);
        }
        x
    }

    /// `apply` to each `xs[k]` under `perms[which[k]]`, in place. The same images, found
    /// a round at a time over all elements still out of range: one at a time, each element
    /// waited on its own chain of multiplies and the cycle walk's exit branch went the wrong
    /// way about half the time.
    pub fn apply_many(perms: &[Permutation], which: &[u32], xs: &mut [u64]) {
        debug_assert_eq!(which.len(), xs.len());
        let mut pending: Vec<u32> = (0..xs.len() as u32).filter(|&k| perms[which[k as usize] as usize].n > 1).collect();
        while !pending.is_empty() {
            let mut kept = 0;
            for r in 0..pending.len() {
                let k = pending[r] as usize;
                let p = &perms[which[k] as usize];
                let x = p.round(xs[k]);
                xs[k] = x;
                pending[kept] = k as u32;
                kept += (x >= p.n) as usize;
            }
            pending.truncate(kept);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_values_are_stable() {
        // Pinned: a change here changes every cache ever built. The same values are pinned
        // in tests/test_shuffle.py against a Python reimplementation (tests/model.py).
        assert_eq!(mix64(0), 0);
        assert_eq!(mix64(1), 0x5692_161d_100b_05e5);
        assert_eq!(mix64(0xdead_beef), 0x4e06_2702_ec92_9eea);
        assert_eq!(combine(0, 0), 0x5196_65bf_9141_6c4d);
        assert_eq!(cell_hash(0, 0, 0), 0x44d6_b7e3_2390_bbb0);
        assert_eq!(cell_hash(42, 3, 1000), 0xf7b9_ea67_c1b1_e9a1);
        assert_eq!(cell_hash(u64::MAX, (1 << 24) - 1, (1 << 40) - 1), 0xaf0e_2adf_8407_8823);
        assert_eq!(SplitMix64::new(0).next_u64(), 0xE220_A839_7B1D_CDAF);
        let mut r = SplitMix64::new(1);
        assert_eq!((0..8).map(|_| r.below(10)).collect::<Vec<_>>(), vec![5, 7, 9, 4, 4, 7, 8, 5]);
        // n just above 2^63 rejects about half the draws: pins the rejection loop too.
        let mut r = SplitMix64::new(3);
        assert_eq!(
            (0..6).map(|_| r.below((1 << 63) + 1)).collect::<Vec<_>>(),
            vec![
                1046394712501569526,
                672077022357742823,
                8196980753821780235,
                8195237237126968761,
                6441936413023419750,
                3099058506491908065
            ]
        );
        let mut v: Vec<u32> = (0..10).collect();
        fisher_yates(&mut v, &mut cell_rng(0, 0));
        assert_eq!(v, vec![1, 9, 5, 4, 3, 6, 7, 8, 2, 0]);
        let mut v: Vec<u32> = (0..10).collect();
        fisher_yates(&mut v, &mut cell_rng(7, 3));
        assert_eq!(v, vec![0, 6, 3, 9, 5, 4, 8, 2, 1, 7]);
    }

    #[test]
    fn below_is_in_range_and_hits_all_values() {
        let mut rng = SplitMix64::new(7);
        let mut seen = [0u32; 7];
        for _ in 0..7000 {
            seen[rng.below(7) as usize] += 1;
        }
        assert!(seen.iter().all(|&c| c > 800 && c < 1200), "{seen:?}");
    }

    #[test]
    fn apply_many_is_apply_of_each() {
        let perms: Vec<Permutation> =
            [1u64, 2, 3, 100, 1000, 8192, 5000].iter().enumerate().map(|(k, &n)| Permutation::new(n, k as u64)).collect();
        let mut rng = SplitMix64::new(11);
        let which: Vec<u32> = (0..3000).map(|_| rng.below(perms.len() as u64) as u32).collect();
        let mut xs: Vec<u64> = which.iter().map(|&w| rng.below(perms[w as usize].n)).collect();
        let want: Vec<u64> = which.iter().zip(&xs).map(|(&w, &x)| perms[w as usize].apply(x)).collect();
        Permutation::apply_many(&perms, &which, &mut xs);
        assert_eq!(xs, want);
    }

    #[test]
    fn permutation_is_a_bijection() {
        for n in [1u64, 2, 3, 5, 16, 17, 100, 1000] {
            let p = Permutation::new(n, 42);
            let mut seen = vec![false; n as usize];
            for i in 0..n {
                let j = p.apply(i);
                assert!(!seen[j as usize]);
                seen[j as usize] = true;
            }
        }
    }
}

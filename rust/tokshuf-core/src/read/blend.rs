//! Weighted blending of several datasets (DESIGN §7): the periodic schedule and O(1) lookup.
//!
//! Weights are normalised and quantised to integers `q_i` summing to the quantum `D` by the
//! largest-remainder method; one period of `D` draws is then computed with the corrected greedy
//! rule "at draw j take `argmax_i((j+1)*q_i/D - C_i)`, ties to the lowest i". After `D` draws
//! every `C_i == q_i`, so the period repeats and blended example `m` is dataset `k`'s example
//! `(m / D) * q_k + C` with `(k, C) = draw[m % D]`. Memory is O(D + n) whatever the length of
//! the run; nothing is materialised per sample.
//!
//! Quantisation is done in f64 with one fixed formula (`x_i = (w_i / W) * D`, W summed left to
//! right), so it is reproducible bit for bit on any IEEE machine and in a Python reference.
//! A dataset whose share rounds to 0 is raised to `q_i = 1` (one unit taken from the largest
//! `q`, ties to the lowest index) and reported in `raised()`: a dataset that was asked for is
//! never silently dropped. `D < n` cannot give every dataset a draw and is a config error.
//!
//! The greedy period is computed exactly in integers: dataset i's key at draw j is the line
//! `(j+1)*q_i - D*C_i = q_i*j + (q_i - D*C_i)` in j. A kinetic tournament tree over these lines
//! keeps the argmax: each internal node holds the winner of its subtree at the current draw and
//! the first draw at which some comparison below it can change ("melt"); advancing to the next
//! draw recomputes only the nodes whose certificates expired, and a pick changes one line's
//! intercept (a path update). Construction costs O((D + n) log n) node visits in practice
//! (plus certificate failures), instead of the O(D * n) of a scan over all datasets per draw.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::read::order::{Loc, Source};

/// Largest quantum accepted: the period costs 12 bytes per draw (12 GiB at this bound).
pub const MAX_QUANTUM: u64 = 1 << 30;

/// The default quantum of DESIGN §7.
pub const DEFAULT_QUANTUM: u64 = 1 << 16;

/// Integer shares of a blend: `quanta` sum to the quantum; `raised` lists the datasets whose
/// share rounded to 0 and that were given one draw per period anyway.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quanta {
    pub quanta: Vec<u32>,
    pub raised: Vec<u32>,
}

fn check_quantum(d: u64) -> Result<()> {
    if d == 0 || d > MAX_QUANTUM {
        return Err(Error::Config(format!("blend quantum {d} must be in 1..={MAX_QUANTUM}")));
    }
    crate::memory::check_fits(Some(12 * d), || format!("the period of blend quantum {d}"))
}

/// Normalise `weights` and quantise them to integers summing to `quantum` (largest remainder,
/// ties to the lowest index), then raise zero shares to 1 (see module docs).
pub fn quantise(weights: &[f64], quantum: u64) -> Result<Quanta> {
    let n = weights.len();
    if n == 0 {
        return Err(Error::Config("a blend needs at least one dataset".into()));
    }
    check_quantum(quantum)?;
    if (n as u64) > quantum {
        return Err(Error::Config(format!(
            "blend quantum {quantum} is smaller than the number of datasets ({n}): every dataset \
             needs at least one draw per period; raise the quantum"
        )));
    }
    for (i, &w) in weights.iter().enumerate() {
        if !(w.is_finite() && w > 0.0) {
            return Err(Error::Config(format!("blend weight of dataset {i} is {w}: weights must be finite and > 0")));
        }
    }
    let mut total = 0.0f64;
    for &w in weights {
        total += w;
    }
    if !total.is_finite() {
        return Err(Error::Config("blend weights are too large: their sum overflows".into()));
    }
    let d = quantum as f64;
    let mut q: Vec<u64> = Vec::with_capacity(n);
    let mut rem: Vec<f64> = Vec::with_capacity(n);
    for &w in weights {
        // w <= total, so x <= D; floor and the remainder are exact.
        let x = (w / total) * d;
        let base = x.floor();
        q.push((base as u64).min(quantum));
        rem.push(x - base);
    }
    let mut order: Vec<usize> = (0..n).collect();
    // Largest remainder first; the stable sort keeps ties in index order.
    order.sort_by(|&a, &b| rem[b].total_cmp(&rem[a]));
    let mut sum: u64 = q.iter().sum();
    // Rounding of W can make the floors overshoot D by a unit or two with millions of datasets.
    while sum > quantum {
        let top = argmax(&q);
        q[top] -= 1;
        sum -= 1;
    }
    let mut next = 0;
    while sum < quantum {
        q[order[next % n]] += 1;
        next += 1;
        sum += 1;
    }
    let mut raised = Vec::new();
    for i in 0..n {
        if q[i] == 0 {
            // D >= n guarantees some share >= 2 while any share is 0.
            let top = argmax(&q);
            q[top] -= 1;
            q[i] = 1;
            raised.push(i as u32);
        }
    }
    Ok(Quanta { quanta: q.into_iter().map(|x| x as u32).collect(), raised })
}

/// Index of the largest value, ties to the lowest index.
fn argmax(v: &[u64]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// One period of the blend schedule and the lookups over it.
#[derive(Clone, Debug)]
pub struct Schedule {
    quantum: u64,
    requested: Vec<f64>,
    quanta: Vec<u32>,
    raised: Vec<u32>,
    /// Dataset of draw j.
    ks: Vec<u32>,
    /// How many draws of that dataset precede draw j in the period.
    cs: Vec<u32>,
    /// Draws of dataset k in order: `pos[offsets[k] + c]` is the draw j of its c-th example.
    pos: Vec<u32>,
    offsets: Vec<u64>,
    /// Largest `j*q_i - D*C_i(j)` (lag, in units of 1/D samples) and `D*C_i(j) - j*q_i` (lead).
    max_lag: i64,
    max_lead: i64,
}

impl Schedule {
    /// The schedule of `weights` (any positive finite numbers) with period `quantum`.
    pub fn new(weights: &[f64], quantum: u64) -> Result<Schedule> {
        let Quanta { quanta, raised } = quantise(weights, quantum)?;
        let total: f64 = weights.iter().fold(0.0, |a, &w| a + w);
        let requested = weights.iter().map(|&w| w / total).collect();
        Ok(Self::build(quanta, raised, requested))
    }

    /// The schedule of integer shares given directly (the quantum is their sum); every share
    /// must be >= 1.
    pub fn from_quanta(quanta: &[u32]) -> Result<Schedule> {
        if quanta.is_empty() {
            return Err(Error::Config("a blend needs at least one dataset".into()));
        }
        if let Some(i) = quanta.iter().position(|&q| q == 0) {
            return Err(Error::Config(format!("blend share of dataset {i} is 0: every share must be >= 1")));
        }
        let d: u64 = quanta.iter().map(|&q| q as u64).sum();
        check_quantum(d)?;
        let requested = quanta.iter().map(|&q| q as f64 / d as f64).collect();
        Ok(Self::build(quanta.to_vec(), Vec::new(), requested))
    }

    fn build(quanta: Vec<u32>, raised: Vec<u32>, requested: Vec<f64>) -> Schedule {
        let n = quanta.len();
        let d: u64 = quanta.iter().map(|&q| q as u64).sum();
        let mut offsets = Vec::with_capacity(n + 1);
        let mut acc = 0u64;
        offsets.push(0);
        for &q in &quanta {
            acc += q as u64;
            offsets.push(acc);
        }
        let mut ks = Vec::with_capacity(d as usize);
        let mut cs = Vec::with_capacity(d as usize);
        let mut pos = vec![0u32; d as usize];
        let mut counts = vec![0u32; n];
        let (mut max_lag, mut max_lead) = (0i64, 0i64);
        let mut t = Tournament::new(&quanta, d as i64);
        for j in 0..d as i64 {
            let k = t.argmax_at(j);
            let c = counts[k];
            let q = quanta[k] as i64;
            max_lag = max_lag.max(j * q - d as i64 * c as i64);
            max_lead = max_lead.max((c as i64 + 1) * d as i64 - (j + 1) * q);
            ks.push(k as u32);
            cs.push(c);
            pos[(offsets[k] + c as u64) as usize] = j as u32;
            counts[k] = c + 1;
            t.pick(k, j);
        }
        debug_assert!(counts == quanta);
        Schedule { quantum: d, requested, quanta, raised, ks, cs, pos, offsets, max_lag, max_lead }
    }

    pub fn num_datasets(&self) -> usize {
        self.quanta.len()
    }
    /// The period D (the sum of the quanta).
    pub fn quantum(&self) -> u64 {
        self.quantum
    }
    pub fn quanta(&self) -> &[u32] {
        &self.quanta
    }
    /// Datasets whose share rounded to 0 and were raised to 1.
    pub fn raised(&self) -> &[u32] {
        &self.raised
    }
    /// The normalised weights as asked (`w_i / sum w`).
    pub fn requested(&self) -> &[f64] {
        &self.requested
    }
    /// What each period delivers: `q_i / D`.
    pub fn achieved(&self) -> Vec<f64> {
        self.quanta.iter().map(|&q| q as f64 / self.quantum as f64).collect()
    }
    /// Largest amount (in samples) by which a dataset falls behind its share `j*q_i/D` at any
    /// point of the period. Can exceed 1 with four or more datasets.
    pub fn max_lag(&self) -> f64 {
        self.max_lag as f64 / self.quantum as f64
    }
    /// Largest amount (in samples) by which a dataset runs ahead of its share; always < 1.
    pub fn max_lead(&self) -> f64 {
        self.max_lead as f64 / self.quantum as f64
    }
    /// The whole period: datasets and per-dataset counters of draws 0..D.
    pub fn period(&self) -> (&[u32], &[u32]) {
        (&self.ks, &self.cs)
    }

    /// Blended example `m` is example `e` of dataset `k`: returns `(k, e)`. O(1).
    #[inline]
    pub fn locate(&self, m: u64) -> (usize, u64) {
        let j = (m % self.quantum) as usize;
        let k = self.ks[j] as usize;
        // (m / D) * q_k <= m, so this cannot overflow.
        (k, (m / self.quantum) * self.quanta[k] as u64 + self.cs[j] as u64)
    }

    /// `locate` for a single pass over finite datasets: the example index wraps modulo the
    /// dataset's size, so no lookup is ever out of range.
    #[inline]
    pub fn locate_wrapped(&self, m: u64, sizes: &[u64]) -> (usize, u64) {
        let (k, e) = self.locate(m);
        (k, e % sizes[k])
    }

    /// Check `sizes` before `locate_wrapped`: one positive size per dataset.
    pub fn check_sizes(&self, sizes: &[u64]) -> Result<()> {
        if sizes.len() != self.num_datasets() {
            return Err(Error::Config(format!("{} dataset sizes given for a blend of {} datasets", sizes.len(), self.num_datasets())));
        }
        if let Some(i) = sizes.iter().position(|&s| s == 0) {
            return Err(Error::Config(format!("dataset {i} of the blend has no examples")));
        }
        Ok(())
    }

    /// The blended index at which dataset `k`'s example `e` is drawn (inverse of `locate`), or
    /// None if it is beyond u64.
    pub fn position(&self, k: usize, e: u64) -> Option<u64> {
        let q = self.quanta[k] as u64;
        let j = self.pos[(self.offsets[k] + e % q) as usize] as u64;
        (e / q).checked_mul(self.quantum)?.checked_add(j)
    }

    /// Draws of each dataset among blended examples `0..m`.
    pub fn counts(&self, m: u64) -> Vec<u64> {
        let full = m / self.quantum;
        let mut out: Vec<u64> = self.quanta.iter().map(|&q| full * q as u64).collect();
        for &k in &self.ks[..(m % self.quantum) as usize] {
            out[k as usize] += 1;
        }
        out
    }

    /// The shortest blend prefix that draws every example of every dataset at least once
    /// (the natural length of a single pass): `1 + max_k position(k, size_k - 1)`.
    pub fn cover_length(&self, sizes: &[u64]) -> Result<u64> {
        self.check_sizes(sizes)?;
        let mut longest = 0u64;
        for (k, &s) in sizes.iter().enumerate() {
            let p = self
                .position(k, s - 1)
                .and_then(|p| p.checked_add(1))
                .ok_or_else(|| Error::Config(format!("dataset {k} of the blend is too large to cover")))?;
            longest = longest.max(p);
        }
        Ok(longest)
    }
}

/// A blend as the reader's example source: blended example m is example e of component k,
/// `(k, e)` from the schedule, and component k places its own example e with its own source
/// (its §6 order with the reader's R*, or its manifest order in a single pass).
///
/// A single pass is a blend of finite components: e wraps modulo the component's size and the
/// pass ends after `cover_length` examples, when every example of every component was drawn.
pub struct BlendSource {
    schedule: Arc<Schedule>,
    components: Vec<Arc<dyn Source>>,
    /// Component sizes when they are finite (single pass), for the wrap.
    sizes: Option<Vec<u64>>,
    length: Option<u64>,
    description: String,
}

impl BlendSource {
    /// `components[k]` serves the schedule's dataset k; either all are finite or none is.
    pub fn new(schedule: Arc<Schedule>, components: Vec<Arc<dyn Source>>) -> Result<BlendSource> {
        if components.len() != schedule.num_datasets() {
            return Err(Error::Config(format!("{} sources given for a blend of {} datasets", components.len(), schedule.num_datasets())));
        }
        let finite: Vec<Option<u64>> = components.iter().map(|c| c.num_examples()).collect();
        let (sizes, length) = if finite.iter().all(Option::is_some) {
            let sizes: Vec<u64> = finite.into_iter().flatten().collect();
            let length = schedule.cover_length(&sizes)?;
            (Some(sizes), Some(length))
        } else if finite.iter().all(Option::is_none) {
            (None, None)
        } else {
            return Err(Error::Config("a blend cannot mix endless and single-pass sources".into()));
        };
        // Digest, not concatenation: a blend may have 10^4 components.
        let mut h = Sha256::new();
        for (q, c) in schedule.quanta().iter().zip(&components) {
            h.update(format!("{q} {}\0", c.describe()).as_bytes());
        }
        let description = format!("blend-v1 D={} n={} {}", schedule.quantum(), schedule.num_datasets(), crate::format::hex(&h.finalize()));
        Ok(BlendSource { schedule, components, sizes, length, description })
    }
}

impl Source for BlendSource {
    fn locate(&self, m: u64) -> Loc {
        let (k, e) = match &self.sizes {
            Some(sizes) => self.schedule.locate_wrapped(m, sizes),
            None => self.schedule.locate(m),
        };
        Loc { component: k, ..self.components[k].locate(e) }
    }
    fn num_examples(&self) -> Option<u64> {
        self.length
    }
    fn describe(&self) -> String {
        self.description.clone()
    }
}

const NONE: u32 = u32::MAX;
const NEVER: i64 = i64::MAX;

/// Kinetic tournament over the lines `key_i(t) = slope_i * t + icpt_i`: node `x` (1-based heap
/// layout, leaves at `size + i`) holds the winner of its subtree at the current time and
/// `melt[x]`, the earliest time at which a comparison in its subtree may change.
struct Tournament {
    size: usize,
    slope: Vec<i64>,
    icpt: Vec<i64>,
    winner: Vec<u32>,
    melt: Vec<i64>,
    period: i64,
}

impl Tournament {
    fn new(quanta: &[u32], period: i64) -> Tournament {
        let n = quanta.len();
        let size = n.next_power_of_two();
        let slope: Vec<i64> = quanta.iter().map(|&q| q as i64).collect();
        // key at draw j with C_i = 0: (j+1)*q_i = q_i*j + q_i.
        let icpt = slope.clone();
        let mut winner = vec![NONE; 2 * size];
        for i in 0..n {
            winner[size + i] = i as u32;
        }
        let mut t = Tournament { size, slope, icpt, winner, melt: vec![NEVER; 2 * size], period };
        for x in (1..size).rev() {
            t.pull(x, 0);
        }
        t
    }

    #[inline]
    fn key(&self, i: u32, t: i64) -> i64 {
        self.slope[i as usize] * t + self.icpt[i as usize]
    }

    /// Whether `a` wins over `b` at time t: larger key, ties to the lower index.
    #[inline]
    fn beats(&self, a: u32, b: u32, t: i64) -> bool {
        let (ka, kb) = (self.key(a, t), self.key(b, t));
        ka > kb || (ka == kb && a < b)
    }

    /// First time after `t` at which `l` beats `w`, given that `w` beats `l` at `t`.
    #[inline]
    fn overtake(&self, w: u32, l: u32) -> i64 {
        let (w, l) = (w as usize, l as usize);
        let da = self.slope[l] - self.slope[w];
        if da <= 0 {
            return NEVER;
        }
        let db = self.icpt[l] - self.icpt[w];
        if l < w {
            // First t with da*t + db >= 0: ceil(-db / da).
            -db.div_euclid(da)
        } else {
            // First t with da*t + db > 0: floor(-db / da) + 1.
            (-db).div_euclid(da) + 1
        }
    }

    /// Recompute node `x` from its children, both valid at time `t`.
    #[inline]
    fn pull(&mut self, x: usize, t: i64) {
        let (a, b) = (self.winner[2 * x], self.winner[2 * x + 1]);
        let (w, own) = if b == NONE {
            (a, NEVER)
        } else if a == NONE {
            (b, NEVER)
        } else if self.beats(a, b, t) {
            (a, self.overtake(a, b))
        } else {
            (b, self.overtake(b, a))
        };
        self.winner[x] = w;
        self.melt[x] = own.min(self.melt[2 * x]).min(self.melt[2 * x + 1]);
    }

    /// Bring every expired certificate under node `x` up to time `t`.
    fn advance(&mut self, x: usize, t: i64) {
        if self.melt[x] > t {
            return;
        }
        // Leaves never melt, so x is internal here.
        self.advance(2 * x, t);
        self.advance(2 * x + 1, t);
        self.pull(x, t);
    }

    /// The dataset with the largest key at draw `t` (ties to the lowest index).
    fn argmax_at(&mut self, t: i64) -> usize {
        // With one dataset node 1 is the leaf itself (never melts).
        self.advance(1, t);
        self.winner[1] as usize
    }

    /// Dataset `k` was drawn at time `t`: its counter grows by one, its key drops by D.
    fn pick(&mut self, k: usize, t: i64) {
        self.icpt[k] -= self.period;
        let mut x = (self.size + k) / 2;
        while x >= 1 {
            self.pull(x, t);
            x /= 2;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rule of DESIGN §7 written as plainly as possible: O(D * n).
    fn naive(quanta: &[u32]) -> (Vec<u32>, Vec<u32>) {
        let d: i64 = quanta.iter().map(|&q| q as i64).sum();
        let mut c = vec![0i64; quanta.len()];
        let (mut ks, mut cs) = (vec![], vec![]);
        for j in 0..d {
            let mut best = 0;
            for i in 1..quanta.len() {
                let ki = (j + 1) * quanta[i] as i64 - d * c[i];
                let kb = (j + 1) * quanta[best] as i64 - d * c[best];
                if ki > kb {
                    best = i;
                }
            }
            ks.push(best as u32);
            cs.push(c[best] as u32);
            c[best] += 1;
        }
        (ks, cs)
    }

    fn lcg(state: &mut u64) -> u64 {
        *state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        *state >> 33
    }

    #[test]
    fn matches_naive_greedy() {
        let mut s = 7u64;
        for round in 0..300 {
            let n = 1 + (lcg(&mut s) % 40) as usize;
            let quanta: Vec<u32> = (0..n)
                .map(|_| match round % 3 {
                    0 => 1 + (lcg(&mut s) % 5) as u32,
                    1 => 1 + (lcg(&mut s) % 200) as u32,
                    _ => 1 + ((lcg(&mut s) % 4) * (lcg(&mut s) % 50)) as u32,
                })
                .collect();
            let sched = Schedule::from_quanta(&quanta).unwrap();
            let (ks, cs) = sched.period();
            let (nk, nc) = naive(&quanta);
            assert_eq!(ks, &nk[..], "quanta {quanta:?}");
            assert_eq!(cs, &nc[..]);
        }
    }

    #[test]
    fn locate_and_position_are_inverse() {
        let sched = Schedule::new(&[0.5, 0.25, 0.125, 0.125, 3.0], 97).unwrap();
        let d = sched.quantum();
        let mut seen = vec![0u64; 5];
        for m in 0..5 * d + 13 {
            let (k, e) = sched.locate(m);
            assert_eq!(e, seen[k], "examples of each dataset come in order");
            seen[k] += 1;
            assert_eq!(sched.position(k, e), Some(m));
            assert_eq!(sched.counts(m + 1), seen);
        }
    }

    #[test]
    fn quantise_largest_remainder_and_raise() {
        assert_eq!(quantise(&[1.0, 1.0, 1.0], 10).unwrap().quanta, vec![4, 3, 3]);
        assert_eq!(quantise(&[0.1, 0.9], 65536).unwrap().quanta, vec![6554, 58982]);
        let q = quantise(&[1e-9, 1.0, 1e-9], 16).unwrap();
        assert_eq!(q.quanta, vec![1, 14, 1]);
        assert_eq!(q.raised, vec![0, 2]);
        assert!(quantise(&[], 16).is_err());
        assert!(quantise(&[1.0, 0.0], 16).is_err());
        assert!(quantise(&[1.0, f64::NAN], 16).is_err());
        assert!(quantise(&[1.0, -1.0], 16).is_err());
        assert!(quantise(&[1.0; 5], 4).is_err());
        assert!(quantise(&[1.0], 0).is_err());
        assert!(quantise(&[f64::MAX, f64::MAX], 16).is_err());
    }

    #[test]
    fn megatron_counterexample_stays_in_range() {
        // Two datasets of 2 samples, weights 0.1 / 0.9: Megatron's loop asks dataset 0 for
        // more than it has; here every period is exact and a single pass wraps.
        let sched = Schedule::new(&[0.1, 0.9], 65536).unwrap();
        let sizes = [2u64, 2];
        sched.check_sizes(&sizes).unwrap();
        for m in 0..200_000 {
            let (k, e) = sched.locate_wrapped(m, &sizes);
            assert!(e < sizes[k]);
        }
        let cover = sched.cover_length(&sizes).unwrap();
        assert_eq!(sched.counts(cover).iter().zip(&sizes).filter(|(c, s)| c >= s).count(), 2);
        assert!(sched.counts(cover - 1).iter().zip(&sizes).any(|(c, s)| c < s));
    }

    #[test]
    fn blend_source_composes_schedule_and_orders() {
        use crate::read::order::{cache_source, OrderOptions};
        let layouts: [(&[u64], u64); 3] = [(&[4, 4, 2], 4), (&[3], 3), (&[5, 5, 5, 1, 5], 5)];
        let sched = Arc::new(Schedule::new(&[0.5, 0.2, 0.3], 17).unwrap());
        let opts = OrderOptions { ideal_readers: 3, seed: 4, reshuffle: true };
        for single_pass in [false, true] {
            let comps: Vec<Arc<dyn Source>> = layouts.iter().map(|(s, cs)| cache_source(s, *cs, 1, opts, single_pass)).collect();
            let src = BlendSource::new(sched.clone(), comps.clone()).unwrap();
            let totals: Vec<u64> = layouts.iter().map(|(s, _)| s.iter().sum()).collect();
            assert_eq!(src.num_examples(), single_pass.then(|| sched.cover_length(&totals).unwrap()));
            let mut seen = std::collections::HashSet::new();
            for m in 0..src.num_examples().unwrap_or(500) {
                let (k, e) = sched.locate(m);
                let e = if single_pass { e % totals[k] } else { e };
                let want = Loc { component: k, ..comps[k].locate(e) };
                assert_eq!(src.locate(m), want);
                seen.insert(want);
            }
            if single_pass {
                assert_eq!(seen.len() as u64, totals.iter().sum::<u64>(), "a single pass covers everything");
            }
        }
        let mixed =
            vec![cache_source(&[2], 2, 1, opts, true), cache_source(&[2], 2, 1, opts, false), cache_source(&[2], 2, 1, opts, false)];
        assert!(BlendSource::new(sched.clone(), mixed).is_err());
        assert!(BlendSource::new(sched, vec![cache_source(&[2], 2, 1, opts, true)]).is_err());
    }

    #[test]
    fn bounds_hold_and_many_datasets_are_fast() {
        let n = 10_000;
        let weights: Vec<f64> = (0..n).map(|i| 1.0 + (i % 97) as f64 * (i % 13) as f64).collect();
        let t0 = std::time::Instant::now();
        let sched = Schedule::new(&weights, 65536).unwrap();
        let took = t0.elapsed();
        assert_eq!(sched.quanta().iter().map(|&q| q as u64).sum::<u64>(), 65536);
        assert!(sched.max_lead() < 1.0);
        let (ks, _) = sched.period();
        let mut c = vec![0u32; n];
        for &k in ks {
            c[k as usize] += 1;
        }
        assert_eq!(c, sched.quanta());
        eprintln!("10k datasets, D=65536: {took:?}, max lag {}", sched.max_lag());
    }
}

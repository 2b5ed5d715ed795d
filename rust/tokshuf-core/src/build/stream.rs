//! The chunk order of `shuffle=False` builds, computed incrementally so chunks can be written
//! while stage 1 still runs (DESIGN §5, last bullet).
//!
//! Round `j` holds the `j`-th chunk of every input file that has one, in file order; rounds
//! follow each other; the chunks of the stitched tails (if any) come after the last round.
//! So chunk `c` is the `(c div K)`-th chunk of file `c mod K` while no file is exhausted, and
//! exhausted files simply drop out of later rounds.
//!
//! The index of file f's chunk j is known once every file before it in this order is known to
//! have or not have its chunk: a file has chunk j once it holds `(j+1) * chunk_size` contexts,
//! and a finished file of `n` contexts has exactly `ceil(n / chunk_size)` chunks. The cursor
//! below places chunks in order as soon as that holds, and only then, so the order is a pure
//! function of the inputs, never of which file happened to be tokenized first.

/// One chunk of the order: contexts `start..start+len` of `file`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placed {
    pub chunk: u64,
    pub file: usize,
    pub start: u64,
    pub len: u64,
}

/// Places round-robin chunks as the files' context counts become known.
pub struct RoundRobin {
    cs: u64,
    known: Vec<u64>,
    finals: Vec<Option<u64>>,
    round: u64,
    file: usize,
    next_chunk: u64,
    /// Chunks placed per file (all of a finished file's chunks placed: nothing left to read).
    placed: Vec<u64>,
}

impl RoundRobin {
    pub fn new(files: usize, chunk_size: u64) -> Self {
        RoundRobin {
            cs: chunk_size.max(1),
            known: vec![0; files],
            finals: vec![None; files],
            round: 0,
            file: 0,
            next_chunk: 0,
            placed: vec![0; files],
        }
    }

    /// File `f` holds at least `contexts` contexts, more may follow.
    pub fn set_known(&mut self, f: usize, contexts: u64) {
        self.known[f] = self.known[f].max(contexts);
    }

    /// File `f` is finished with `contexts` contexts.
    pub fn set_final(&mut self, f: usize, contexts: u64) {
        self.known[f] = contexts;
        self.finals[f] = Some(contexts);
    }

    /// Index the next chunk will get.
    pub fn next_chunk(&self) -> u64 {
        self.next_chunk
    }

    /// True when every file is finished and every chunk is placed.
    pub fn done(&self) -> bool {
        self.finals.iter().zip(&self.placed).all(|(f, &p)| f.is_some_and(|n| p == n.div_ceil(self.cs)))
    }

    /// True when all chunks of file `f` are placed (it will not be read again).
    pub fn file_done(&self, f: usize) -> bool {
        self.finals[f].is_some_and(|n| self.placed[f] == n.div_ceil(self.cs))
    }

    /// Chunks whose place became known since the last call, in chunk order.
    pub fn advance(&mut self) -> Vec<Placed> {
        let mut out = Vec::new();
        let k = self.known.len();
        loop {
            if self.file == k {
                if self.done() {
                    break;
                }
                self.round += 1;
                self.file = 0;
            }
            let (f, j, cs) = (self.file, self.round, self.cs);
            let len = match self.finals[f] {
                Some(n) if j * cs < n => (n - j * cs).min(cs),
                Some(_) => 0, // exhausted: drops out of this round
                None if self.known[f] >= (j + 1) * cs => cs,
                None => break, // not yet known whether f has chunk j
            };
            if len > 0 {
                out.push(Placed { chunk: self.next_chunk, file: f, start: j * cs, len });
                self.next_chunk += 1;
                self.placed[f] += 1;
            }
            self.file += 1;
        }
        out
    }
}

/// The whole order for known context counts: round robin over `counts`, then `stitched`
/// contexts (the file index after the last) in order.
pub fn plan(counts: &[u64], stitched: Option<u64>, chunk_size: u64) -> Vec<Placed> {
    let mut rr = RoundRobin::new(counts.len(), chunk_size);
    for (f, &n) in counts.iter().enumerate() {
        rr.set_final(f, n);
    }
    let mut chunks = rr.advance();
    chunks.extend(tail_chunks(counts.len(), stitched.unwrap_or(0), chunk_size, rr.next_chunk()));
    chunks
}

/// Chunks of the stitched tails (file `file`, `n` contexts), numbered from `first`.
pub fn tail_chunks(file: usize, n: u64, chunk_size: u64, first: u64) -> Vec<Placed> {
    (0..n.div_ceil(chunk_size))
        .map(|j| Placed { chunk: first + j, file, start: j * chunk_size, len: (n - j * chunk_size).min(chunk_size) })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(p: &[Placed]) -> Vec<usize> {
        p.iter().map(|c| c.file).collect()
    }

    #[test]
    fn round_robin_drops_exhausted_files() {
        // file 0: 3 chunks, file 1: 1 chunk, file 2: 2 chunks (chunk size 2); 3 stitched contexts
        let chunks = plan(&[5, 2, 4], Some(3), 2);
        assert_eq!(files(&chunks), vec![0, 1, 2, 0, 2, 0, 3, 3]);
        assert_eq!(chunks[5], Placed { chunk: 5, file: 0, start: 4, len: 1 });
        assert_eq!(chunks[7], Placed { chunk: 7, file: 3, start: 2, len: 1 });
    }

    #[test]
    fn incremental_placement_matches_the_plan_whatever_the_arrival_order() {
        let counts = [7u64, 0, 3, 12, 5];
        let want = plan(&counts, None, 3);
        // Files grow in a scrambled interleaving, one context at a time.
        let mut rr = RoundRobin::new(counts.len(), 3);
        let mut got = Vec::new();
        let mut have = [0u64; 5];
        let mut step = 0usize;
        while have.iter().zip(&counts).any(|(h, n)| h < n) || !rr.done() {
            let f = (step * 7 + step / 3) % counts.len();
            step += 1;
            if have[f] < counts[f] {
                have[f] += 1;
                rr.set_known(f, have[f]);
            }
            if have[f] == counts[f] {
                rr.set_final(f, counts[f]);
            }
            got.extend(rr.advance());
        }
        assert_eq!(got, want);
    }

    #[test]
    fn index_waits_for_earlier_files() {
        let mut rr = RoundRobin::new(2, 2);
        rr.set_known(1, 4);
        assert!(rr.advance().is_empty(), "file 0 might still have chunk 0");
        rr.set_known(0, 2);
        assert_eq!(files(&rr.advance()), vec![0, 1]);
        rr.set_final(0, 2); // file 0 has no chunk 1: file 1's second chunk is next
        assert_eq!(files(&rr.advance()), vec![1]);
        assert!(!rr.done());
        rr.set_final(1, 4);
        assert!(rr.advance().is_empty());
        assert!(rr.done());
    }
}

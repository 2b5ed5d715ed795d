//! Best-fit packing (DESIGN §9): documents are placed whole into contexts, never split unless
//! longer than a context.
//!
//! Over a window of consecutive documents of one file: a document longer than `seqlen` is cut
//! into `seqlen`-id pieces and its remainder is a piece of its own; pieces are taken longest
//! first (ties by position: document, then piece), and each goes into the open context with the
//! least room that still fits it (ties: the earliest context), else into a new context. Each
//! context holds its pieces in placement order and is padded to `seqlen`. Contexts come out in
//! the order they were opened. A pure function of the window, so any thread count or machine
//! gives the same contexts.

use std::collections::BTreeSet;

/// A piece of a document: `ids[doc][start..end]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub doc: usize,
    pub start: usize,
    pub end: usize,
}

impl Piece {
    fn len(&self) -> usize {
        self.end - self.start
    }
}

/// The contexts of one window of documents of lengths `lens`, as lists of pieces.
pub fn bestfit(lens: &[usize], seqlen: usize) -> Vec<Vec<Piece>> {
    let mut pieces = Vec::new();
    for (doc, &n) in lens.iter().enumerate() {
        let mut start = 0;
        while n - start > seqlen {
            pieces.push(Piece { doc, start, end: start + seqlen });
            start += seqlen;
        }
        if n > start {
            pieces.push(Piece { doc, start, end: n });
        }
    }
    // Pieces are created in position order, so a stable sort by length keeps ties by position.
    pieces.sort_by_key(|p| std::cmp::Reverse(p.len()));
    let mut contexts: Vec<Vec<Piece>> = Vec::new();
    let mut room: Vec<usize> = Vec::new();
    // (room left, context index) of every context that can still take a piece.
    let mut open: BTreeSet<(usize, usize)> = BTreeSet::new();
    for p in pieces {
        let n = p.len();
        let ctx = match open.range((n, 0)..).next().copied() {
            Some(key) => {
                open.remove(&key);
                key.1
            }
            None => {
                contexts.push(Vec::new());
                room.push(seqlen);
                contexts.len() - 1
            }
        };
        contexts[ctx].push(p);
        room[ctx] -= n;
        if room[ctx] > 0 {
            open.insert((room[ctx], ctx));
        }
    }
    contexts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lens_of(ctxs: &[Vec<Piece>]) -> Vec<Vec<usize>> {
        ctxs.iter().map(|c| c.iter().map(|p| p.len()).collect()).collect()
    }

    #[test]
    fn places_longest_first_into_the_tightest_fit() {
        // seqlen 10: pieces 7, 6, 4, 3, 3 -> [7, 3], [6, 4], [3]
        assert_eq!(lens_of(&bestfit(&[3, 7, 4, 6, 3], 10)), vec![vec![7, 3], vec![6, 4], vec![3]]);
        // A long document: two full pieces, and its remainder placed like any document.
        let ctxs = bestfit(&[25, 4], 10);
        assert_eq!(lens_of(&ctxs), vec![vec![10], vec![10], vec![5, 4]]);
        assert_eq!(ctxs[2][0], Piece { doc: 0, start: 20, end: 25 });
    }

    #[test]
    fn no_document_that_fits_is_split() {
        let mut seed = 7u64;
        for _ in 0..200 {
            let lens: Vec<usize> = (0..50)
                .map(|_| {
                    seed = crate::hash::mix64(seed + 1);
                    1 + (seed % 40) as usize
                })
                .collect();
            let ctxs = bestfit(&lens, 32);
            for (doc, &n) in lens.iter().enumerate() {
                let pieces: usize = ctxs.iter().flatten().filter(|p| p.doc == doc).count();
                assert_eq!(pieces, n.div_ceil(32).max(1), "doc {doc} of {n}");
            }
            assert!(ctxs.iter().all(|c| c.iter().map(|p| p.len()).sum::<usize>() <= 32));
        }
    }
}

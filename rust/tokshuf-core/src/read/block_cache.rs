//! Decoded `blocks.zst` members, shared by the threads of one process. The reader's streams
//! each walk a block a few contexts per batch (§6: a batch takes B / R* consecutive contexts
//! of every stream), so a block decoded once serves many batches; the cache holds the blocks
//! in use and evicts the oldest beyond its budget. A block two threads want at once is
//! decoded once: the second waits for the first.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};

/// A decoded block, or why it could not be decoded.
pub(super) type Decoded = std::result::Result<Arc<Vec<u8>>, String>;
type Slot = Arc<OnceLock<Decoded>>;

/// Bytes of decoded blocks held per cache: the blocks of 64 streams at seqlen 2049 in uint32
/// with room to spare (R* defaults to at most 64).
pub(super) const BUDGET: usize = 128 << 20;

pub(super) struct BlockCache {
    /// Blocks held at most (at least a few, whatever their size).
    capacity: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    slots: HashMap<(u64, u64), Slot>,
    fifo: VecDeque<(u64, u64)>,
}

impl BlockCache {
    pub(super) fn new(block_bytes: usize) -> BlockCache {
        BlockCache { capacity: (BUDGET / block_bytes.max(1)).max(8), state: Mutex::new(State::default()) }
    }

    /// Block `block` of chunk `chunk`, decoded by `decode` unless held.
    pub(super) fn get(&self, chunk: u64, block: u64, decode: impl FnOnce() -> Decoded) -> Decoded {
        let slot = {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let key = (chunk, block);
            match st.slots.get(&key) {
                Some(s) => s.clone(),
                None => {
                    while st.fifo.len() >= self.capacity {
                        if let Some(old) = st.fifo.pop_front() {
                            st.slots.remove(&old);
                        }
                    }
                    let s = Slot::default();
                    st.slots.insert(key, s.clone());
                    st.fifo.push_back(key);
                    s
                }
            }
        };
        // Decode outside the lock: other blocks are served meanwhile.
        slot.get_or_init(decode).clone()
    }

    /// Forget chunk `chunk`'s blocks (a remote shard evicted from local disk).
    pub(super) fn forget(&self, chunk: u64) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.slots.retain(|k, _| k.0 != chunk);
        st.fifo.retain(|k| k.0 != chunk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_once_and_evicts_oldest() {
        let cache = BlockCache::new(BUDGET / 8);
        let calls = std::sync::atomic::AtomicUsize::new(0);
        let decode = |v: u8| {
            calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(Arc::new(vec![v]))
        };
        assert_eq!(*cache.get(0, 0, || decode(1)).unwrap(), vec![1]);
        assert_eq!(*cache.get(0, 0, || decode(2)).unwrap(), vec![1], "held: not decoded again");
        for b in 1..=8 {
            cache.get(1, b, || decode(0)).unwrap();
        }
        assert_eq!(*cache.get(0, 0, || decode(3)).unwrap(), vec![3], "evicted after 8 newer blocks");
        assert_eq!(calls.load(std::sync::atomic::Ordering::Relaxed), 10);
        assert!(cache.get(2, 0, || Err("bad".into())).is_err());
    }
}

//! What a caller chooses for a build.

use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::format::{self, ErrorPolicy, Format, InputKind, Packing, Tail, MAX_BLOCK_SIZE};
use crate::tokenize::Backend;

/// Everything a caller chooses. Only `threads`, `memory_limit`, `local_cell_dir` and
/// `progress` may differ between a build and its resumption: they never change the output.
#[derive(Clone, Debug)]
pub struct BuildOptions {
    pub inputs: Vec<PathBuf>,
    pub output: PathBuf,
    pub tokenizer: String,
    pub seqlen: u32,
    pub chunk_size: u32,
    pub num_local_cells: Option<u64>,
    pub local_cell_dir: Option<PathBuf>,
    pub seed: u64,
    /// Worker threads (None: all cores).
    pub threads: Option<usize>,
    pub text_key: String,
    pub format: Format,
    pub tail: Tail,
    pub eot_id: Option<u32>,
    pub pad_id: Option<u32>,
    pub bos: bool,
    pub bos_id: Option<u32>,
    pub allow_special_tokens: bool,
    /// Fast or reference tokenizer implementation; never changes the ids.
    pub tokenizer_backend: Backend,
    pub shuffle: bool,
    /// Bytes the build may hold in proportion to its input: stage 2's cell ids and read-ahead
    /// (`budget`; None: half of physical memory).
    pub memory_limit: Option<u64>,
    pub errors: ErrorPolicy,
    pub progress: bool,
    pub overwrite: bool,
    pub packing: Packing,
    /// Documents per best-fit window (None: `DEFAULT_PACK_WINDOW`).
    pub pack_window: Option<u64>,
    /// Unpacked: the length bins' upper bounds (the last must be `seqlen`)...
    pub bins: Option<Vec<u32>>,
    /// ... or their width (LDDL's equal-width bins; None with no `bins`: `seqlen / 16`, rounded up).
    pub bin_size: Option<u32>,
    /// Contexts per member of a block format (None: `format::DEFAULT_BLOCK_SIZE`).
    pub block_size: Option<u64>,
    /// jsonl to tokenize, or tar shards of contexts to shuffle again.
    pub input_kind: InputKind,
}

/// Length bins of an unpacked cache at most (sub-caches are named `bin_00` .. `bin_99`).
pub const MAX_BINS: usize = 100;

/// Documents per best-fit window unless given: bounds the memory of packing one file.
pub const DEFAULT_PACK_WINDOW: u64 = 1024;

impl BuildOptions {
    /// The options of a build of `inputs` into `output` with every other option at its default.
    pub fn new(inputs: Vec<PathBuf>, output: PathBuf) -> Self {
        BuildOptions {
            inputs,
            output,
            tokenizer: "tiktoken:r50k_base".into(),
            seqlen: 2049,
            chunk_size: 8192,
            num_local_cells: None,
            local_cell_dir: None,
            seed: 0,
            threads: None,
            text_key: "text".into(),
            format: Format::Npy,
            tail: Tail::Stitch,
            eot_id: None,
            pad_id: None,
            bos: false,
            bos_id: None,
            allow_special_tokens: false,
            tokenizer_backend: Backend::Auto,
            shuffle: true,
            memory_limit: None,
            errors: ErrorPolicy::Raise,
            progress: true,
            overwrite: false,
            packing: Packing::Concat,
            pack_window: None,
            bins: None,
            bin_size: None,
            block_size: None,
            input_kind: InputKind::Jsonl,
        }
    }

    /// Checks that need no tokenizer and no file (those are made when the recipe is).
    pub fn validate(&self) -> Result<()> {
        if self.seqlen < 2 {
            // A context of one id has no next-token target: almost surely a typo.
            return Err(Error::Config(format!("seqlen must be at least 2 (inputs and next-token targets), not {}", self.seqlen)));
        }
        if self.chunk_size < 1 {
            return Err(Error::Config(format!("chunk_size must be a positive integer, not {}", self.chunk_size)));
        }
        if let Some(n) = self.num_local_cells.filter(|&n| n == 0 || n > super::cells::MAX_CELLS) {
            return Err(Error::Config(format!("num_local_cells must be between 1 and {} (2**24), not {n}", super::cells::MAX_CELLS)));
        }
        if self.seqlen as u64 > format::MAX_SEQLEN {
            return Err(Error::Config(format!("seqlen must be at most {} (2**24), not {}", format::MAX_SEQLEN, self.seqlen)));
        }
        if let Some(n) = self.threads {
            crate::memory::check_threads(n)?;
        }
        if self.memory_limit == Some(0) {
            return Err(Error::Config("memory_limit must be positive, not 0".into()));
        }
        match (self.packing, self.pack_window) {
            (Packing::Concat | Packing::Unpacked, Some(_)) => {
                return Err(Error::Config("pack_window is an option of packing=\"bestfit\"".into()))
            }
            (_, Some(0)) => return Err(Error::Config("pack_window must be positive, not 0".into())),
            _ => {}
        }
        if !self.packing.is_unpacked() && (self.bins.is_some() || self.bin_size.is_some()) {
            return Err(Error::Config("bins and bin_size are options of packing=\"none\"".into()));
        }
        if self.packing.is_unpacked() {
            self.bin_bounds()?;
            if self.format != Format::Npy {
                return Err(Error::Config("packing=\"none\" writes variable-length npy members: it takes format=\"npy\" only".into()));
            }
        }
        match (self.format.is_blocked(), self.block_size) {
            (false, Some(_)) => return Err(Error::Config("block_size is an option of format=\"blocks\" and \"blocks.zst\"".into())),
            (_, Some(k)) if k == 0 || k > MAX_BLOCK_SIZE => {
                return Err(Error::Config(format!("block_size must be in 1..={MAX_BLOCK_SIZE}, not {k}")))
            }
            _ => {}
        }
        if self.input_kind == InputKind::Shards {
            // Contexts are taken as they are: nothing that shapes them from documents applies.
            let shaping = [
                (!self.shuffle, "shuffle=False"),
                (!self.packing.is_concat(), "a packing other than \"concat\""),
                (self.bos, "bos=True"),
                (self.errors == ErrorPolicy::Skip, "errors=\"skip\""),
            ];
            if let Some((_, what)) = shaping.iter().find(|(on, _)| *on) {
                return Err(Error::Config(format!("shuffle_only (shards as inputs) cannot be combined with {what}")));
            }
        }
        if self.inputs.is_empty() {
            return Err(Error::Config("no input files".into()));
        }
        Ok(())
    }

    /// The length bins' upper bounds of an unpacked build, checked: strictly increasing,
    /// positive, ending at `seqlen`, at most `MAX_BINS`.
    pub fn bin_bounds(&self) -> Result<Vec<u32>> {
        let seqlen = self.seqlen;
        let bounds = match (&self.bins, self.bin_size) {
            (Some(_), Some(_)) => return Err(Error::Config("give bins or bin_size, not both".into())),
            (Some(b), None) => b.clone(),
            (None, size) => {
                let size = size.unwrap_or(seqlen.div_ceil(16));
                if size == 0 {
                    return Err(Error::Config("bin_size must be positive, not 0".into()));
                }
                let n = seqlen.div_ceil(size) as usize;
                if n > MAX_BINS {
                    return Err(Error::Config(format!(
                        "bin_size {size} makes {n} bins of seqlen {seqlen}; at most {MAX_BINS} are allowed"
                    )));
                }
                (1..=n as u32).map(|k| (k * size).min(seqlen)).collect()
            }
        };
        if bounds.is_empty() || bounds.len() > MAX_BINS {
            return Err(Error::Config(format!("bins must list 1 to {MAX_BINS} bounds, not {}", bounds.len())));
        }
        if bounds[0] == 0 || bounds.windows(2).any(|w| w[0] >= w[1]) {
            return Err(Error::Config(format!("bins must be positive and strictly increasing, not {bounds:?}")));
        }
        if bounds.last() != Some(&seqlen) {
            return Err(Error::Config(format!("the last bin must end at seqlen {seqlen} (bins={bounds:?})")));
        }
        Ok(bounds)
    }

    pub fn threads(&self) -> usize {
        self.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    /// Half of physical memory by default.
    pub fn memory_limit(&self) -> u64 {
        self.memory_limit.unwrap_or_else(|| crate::memory::physical().map_or(4 << 30, |m| m / 2))
    }
}

//! What a caller chooses for a build.

use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::format::{ErrorPolicy, Format, Packing, Tail};
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
}

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
        if self.num_local_cells == Some(0) {
            return Err(Error::Config("num_local_cells must be positive, not 0".into()));
        }
        if self.threads == Some(0) {
            return Err(Error::Config("threads must be positive, not 0".into()));
        }
        if self.memory_limit == Some(0) {
            return Err(Error::Config("memory_limit must be positive, not 0".into()));
        }
        match (self.packing, self.pack_window) {
            (Packing::Concat, Some(_)) => return Err(Error::Config("pack_window is an option of packing=\"bestfit\"".into())),
            (_, Some(0)) => return Err(Error::Config("pack_window must be positive, not 0".into())),
            _ => {}
        }
        if self.inputs.is_empty() {
            return Err(Error::Config("no input files".into()));
        }
        Ok(())
    }

    pub fn threads(&self) -> usize {
        self.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    /// Half of physical memory by default.
    pub fn memory_limit(&self) -> u64 {
        self.memory_limit.unwrap_or_else(|| {
            // SAFETY: sysconf has no preconditions.
            let (page, pages) = unsafe { (libc::sysconf(libc::_SC_PAGESIZE), libc::sysconf(libc::_SC_PHYS_PAGES)) };
            if page > 0 && pages > 0 {
                page as u64 * pages as u64 / 2
            } else {
                4 << 30
            }
        })
    }
}

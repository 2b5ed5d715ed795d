//! Planning: the recipe from the options (before stage 1), and the chunk plan from stage 1's
//! summaries (before stage 2): how many contexts, which chunk holds which, in which cells.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Component, Path, PathBuf};

use rayon::ThreadPool;
use serde::{Deserialize, Serialize};

use super::cells::{self, DEFAULT_CELL_CONTEXTS, FILE_BITS, POS_BITS};
use super::stream::{self, Placed};
use super::BuildOptions;
use crate::error::{Error, Result};
use crate::format::{self, Dtype, FileSummary, InputFile, Packing, PackingFigures, Recipe, Tail, TokenizerInfo, Totals};
use crate::tokenize::Tokenizer;

/// The recipe of a build (options checked against the tokenizer, inputs listed and sized), and
/// the folder its local inputs are recorded relative to (`input_files`).
pub fn recipe(opts: &BuildOptions, tok: &Tokenizer) -> Result<(Recipe, Option<PathBuf>)> {
    let eot_id = opts.eot_id.or(tok.eot_id).ok_or_else(|| {
        Error::Config(format!("{}: no end-of-text token found (tried <|endoftext|>, <|end_of_text|>, </s>, <eos>); pass eot_id", tok.spec))
    })?;
    let pad_id = opts.pad_id.or(tok.pad_id).unwrap_or(eot_id);
    let bos_id = if opts.bos {
        Some(opts.bos_id.or(tok.bos_id).ok_or_else(|| Error::Config(format!("{}: no BOS token found; pass bos_id", tok.spec)))?)
    } else {
        None
    };
    for (name, id) in [("eot_id", Some(eot_id)), ("pad_id", Some(pad_id)), ("bos_id", bos_id)] {
        if let Some(id) = id {
            if id >= tok.vocab_size {
                return Err(Error::Config(format!("{name} {id} is not an id of {} (vocab size {})", tok.spec, tok.vocab_size)));
            }
        }
    }
    let (inputs, input_root) = input_files(&opts.inputs)?;
    // Options that shape nothing here are recorded as their defaults: the recipe says what
    // made the cache, and a rerun that differs only in them is the same build.
    let jsonl = opts.input_kind.is_jsonl();
    let tail = if jsonl && opts.packing.is_concat() { opts.tail } else { Tail::Stitch };
    let text_key = if jsonl { opts.text_key.clone() } else { "text".to_string() };
    let recipe = Recipe {
        tokshuf_version: format::VERSION.to_string(),
        format_version: format::FORMAT_VERSION,
        inputs,
        tokenizer: TokenizerInfo {
            spec: tok.spec.clone(),
            sha256: tok.sha256.clone(),
            vocab_size: tok.vocab_size,
            backend: tok.backend.to_string(),
        },
        seqlen: opts.seqlen,
        chunk_size: opts.chunk_size,
        num_local_cells: opts.num_local_cells,
        seed: opts.seed,
        text_key,
        format: opts.format,
        tail,
        eot_id,
        pad_id,
        bos_id,
        allow_special_tokens: opts.allow_special_tokens,
        shuffle: opts.shuffle,
        errors: opts.errors,
        dtype: if tok.vocab_size <= 1 << 16 { Dtype::Uint16 } else { Dtype::Uint32 },
        packing: opts.packing,
        pack_window: (opts.packing == Packing::Bestfit).then(|| opts.pack_window.unwrap_or(super::options::DEFAULT_PACK_WINDOW)),
        bins: opts.packing.is_unpacked().then(|| opts.bin_bounds()).transpose()?,
        block_size: opts.format.is_blocked().then(|| opts.block_size.unwrap_or(format::DEFAULT_BLOCK_SIZE)),
        zstd_level: (opts.format == format::Format::BlocksZst).then_some(format::ZSTD_LEVEL),
        input_kind: opts.input_kind,
    };
    if recipe.input_kind == format::InputKind::Shards {
        let root = input_root.clone().unwrap_or_default();
        let local: Vec<PathBuf> =
            recipe.inputs.iter().filter(|f| !crate::storage::Location::is_url(&f.path)).map(|f| root.join(&f.path)).collect();
        super::shards::check_sources(&recipe, &local)?;
    }
    Ok((recipe, input_root))
}

/// The input files as a recipe records them, sorted (their order is the file index of every
/// context id, DESIGN §5), with their sizes; and the folder the local ones are relative to.
///
/// Object-store URLs are recorded as given. A local file is recorded by its path relative to
/// the deepest folder holding every local input (`input_root`), taken lexically from the
/// absolute paths: so the recipe, and the order, are the same whether the files were named by
/// relative or absolute paths, from any working folder, through a symlinked folder, or on
/// another machine where the corpus lives elsewhere. What the files hold is checked apart
/// (sizes here, sizes and mtimes of an unfinished build in `resume`).
pub fn input_files(given: &[PathBuf]) -> Result<(Vec<InputFile>, Option<PathBuf>)> {
    let mut urls = Vec::new();
    let mut local = Vec::new();
    for p in given {
        match p.to_str().filter(|s| crate::storage::Location::is_url(s)) {
            Some(url) => urls.push(url.to_string()),
            None => local.push(absolute(p)?),
        }
    }
    let root = common_folder(&local);
    let mut named: Vec<(String, PathBuf)> = urls.into_iter().map(|u| (u.clone(), PathBuf::from(u))).collect();
    for abs in local {
        let rel = root.as_deref().and_then(|r| abs.strip_prefix(r).ok()).unwrap_or(&abs);
        // tokshuf.json records the name as JSON text, which cannot hold other bytes.
        let name = rel.to_str().ok_or_else(|| {
            Error::Config(format!(
                "{}: the file name is not UTF-8, and tokshuf records input names as UTF-8 text: rename the file",
                abs.display()
            ))
        })?;
        named.push((name.to_string(), abs.clone()));
    }
    named.sort();
    named.dedup_by(|a, b| a.0 == b.0);
    let inputs = named
        .into_iter()
        .map(|(path, open)| {
            if crate::storage::Location::is_url(&path) {
                let bytes = crate::storage::input_size(&path)?;
                return Ok(InputFile { path, bytes });
            }
            let md = std::fs::metadata(&open).map_err(|e| Error::io(&open, e))?;
            if md.is_dir() {
                return Err(Error::io(&open, std::io::Error::other("is a directory, not an input file")));
            }
            if !md.is_file() {
                // Opening a FIFO waits for a writer, and a resumed build must read its inputs again.
                return Err(Error::io(&open, std::io::Error::other("not a regular file (a FIFO, socket or device), not an input file")));
            }
            // Fail before hours of work on file 1, not when file 900 turns out unreadable.
            File::open(&open).map_err(|e| Error::io(&open, e))?;
            Ok(InputFile { path, bytes: md.len() })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((inputs, root))
}

/// `p` made absolute and normalized lexically (`.` dropped, `..` taking the previous
/// component off), as Python's `os.path.abspath` does; symlinks are not resolved.
fn absolute(p: &Path) -> Result<PathBuf> {
    let abs = std::path::absolute(p).map_err(|e| Error::io(p, e))?;
    let mut out = PathBuf::new();
    for c in abs.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    Ok(out)
}

/// The deepest folder that holds every file of `files` (absolute paths); None for no file.
fn common_folder(files: &[PathBuf]) -> Option<PathBuf> {
    let mut common: Vec<Component<'_>> = files.first()?.parent()?.components().collect();
    for f in &files[1..] {
        let dir: Vec<Component<'_>> = f.parent().map(|d| d.components().collect()).unwrap_or_default();
        let same = common.iter().zip(&dir).take_while(|(a, b)| a == b).count();
        common.truncate(same);
    }
    Some(common.iter().collect())
}

/// Which contexts form which chunk: a pure function of the recipe and the files' context
/// counts. Known after stage 1, before any shard is written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkPlan {
    /// Contexts per input file, then the stitched tails' (if any).
    pub counts: Vec<u64>,
    pub chunk_size: u64,
    /// Shuffled builds: the number of cells and the contexts in each.
    pub cells: Option<u64>,
    pub cell_sizes: Vec<u64>,
    /// Streaming builds: where each chunk's contexts are (file, start, len).
    pub placed: Vec<(usize, u64, u64)>,
}

impl ChunkPlan {
    /// The plan for `summaries` (every input file's, then the stitched tails'), as DESIGN §5 fixes it.
    pub fn new(recipe: &Recipe, summaries: &[FileSummary], num_local_cells: Option<u64>, pool: &ThreadPool) -> Result<Self> {
        let counts: Vec<u64> = summaries.iter().map(|s| s.num_contexts).collect();
        if counts.len() >= 1 << FILE_BITS || counts.iter().any(|&c| c >= 1 << POS_BITS) {
            return Err(Error::Config("too many input files or contexts in one file".into()));
        }
        let cs = recipe.chunk_size as u64;
        let total: u64 = counts.iter().sum();
        if recipe.shuffle {
            let cells = num_local_cells.unwrap_or_else(|| total.div_ceil(DEFAULT_CELL_CONTEXTS)).max(1);
            let cell_sizes = cells::cell_sizes(pool, recipe.seed, &counts, cells);
            Ok(ChunkPlan { counts, chunk_size: cs, cells: Some(cells), cell_sizes, placed: Vec::new() })
        } else {
            let stitched = recipe.stitches_tails();
            let files = &counts[..counts.len() - stitched as usize];
            let tail = stitched.then(|| counts[counts.len() - 1]);
            let placed = stream::plan(files, tail, cs).iter().map(|p| (p.file, p.start, p.len)).collect();
            Ok(ChunkPlan { counts, chunk_size: cs, cells: None, cell_sizes: Vec::new(), placed })
        }
    }

    pub fn num_contexts(&self) -> u64 {
        self.counts.iter().sum()
    }

    pub fn chunk_sizes(&self) -> Vec<u64> {
        if self.cells.is_none() {
            return self.placed.iter().map(|p| p.2).collect();
        }
        let (total, cs) = (self.num_contexts(), self.chunk_size);
        (0..total.div_ceil(cs)).map(|k| cs.min(total - k * cs)).collect()
    }

    pub fn num_chunks(&self) -> u64 {
        if self.cells.is_none() {
            self.placed.len() as u64
        } else {
            self.num_contexts().div_ceil(self.chunk_size)
        }
    }

    /// Streaming builds: chunk `k`'s place.
    pub fn placed(&self, k: u64) -> Option<Placed> {
        self.placed.get(k as usize).map(|&(file, start, len)| Placed { chunk: k, file, start, len })
    }

    /// The ids of the contexts of chunks `chunks`, in order (a shuffled build's from its cells).
    pub fn ids(&self, seed: u64, chunks: std::ops::Range<u64>, pool: &ThreadPool) -> Vec<u64> {
        let Some(ncells) = self.cells else {
            return chunks
                .filter_map(|k| self.placed(k))
                .flat_map(|p| (p.start..p.start + p.len).map(move |i| cells::pack(p.file, i)))
                .collect();
        };
        let cs = self.chunk_size;
        let (c0, c1, skip) = self.cells_of(chunks.start, chunks.end);
        let mut ids = cells::shuffled_cells(pool, seed, &self.counts, ncells, c0, c1, &self.cell_sizes[c0 as usize..c1 as usize]);
        let end = (chunks.end * cs).min(self.num_contexts()) - chunks.start * cs;
        ids.truncate((skip + end) as usize);
        ids.drain(..skip as usize);
        ids
    }

    /// Shuffled builds: the cells that chunks `k0..k1` span, and the position of chunk k0's
    /// first context in the concatenation of those cells.
    pub fn cells_of(&self, k0: u64, k1: u64) -> (u64, u64, u64) {
        let (p0, p1) = (k0 * self.chunk_size, (k1 * self.chunk_size).min(self.num_contexts()));
        let mut before = 0u64;
        let mut c0 = None;
        for (c, &n) in self.cell_sizes.iter().enumerate() {
            if c0.is_none() && before + n > p0 {
                c0 = Some((c as u64, before));
            }
            if before + n >= p1 {
                let (c0, b0) = c0.unwrap_or((c as u64, before));
                return (c0, c as u64 + 1, p0 - b0);
            }
            before += n;
        }
        (0, 0, 0)
    }

    /// Chunk ranges whose cells hold at most about `budget` ids together (at least one chunk
    /// each), so stage 2 never holds more than one group's ids.
    pub fn groups(&self, from: u64, budget: u64) -> Vec<std::ops::Range<u64>> {
        let n = self.num_chunks();
        if self.cells.is_none() {
            return (from..n).step_by(256).map(|k| k..(k + 256).min(n)).collect();
        }
        let cum: Vec<u64> = std::iter::once(0)
            .chain(self.cell_sizes.iter().scan(0, |s, &x| {
                *s += x;
                Some(*s)
            }))
            .collect();
        let cell_of = |p: u64| cum.partition_point(|&x| x <= p) - 1;
        let total = self.num_contexts();
        let mut out = Vec::new();
        let mut k0 = from;
        while k0 < n {
            let first = cell_of(k0 * self.chunk_size);
            let mut k1 = k0 + 1;
            while k1 < n {
                let last = cell_of(((k1 + 1) * self.chunk_size).min(total) - 1);
                if cum[last + 1] - cum[first] > budget {
                    break;
                }
                k1 += 1;
            }
            out.push(k0..k1);
            k0 = k1;
        }
        out
    }
}

/// The cache's figures from its files' summaries (the stitched tails' last, if any).
pub fn totals(summaries: &[FileSummary], recipe: &Recipe, cells: Option<u64>) -> Totals {
    let mut skipped: BTreeMap<String, u64> = BTreeMap::new();
    let mut examples: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for s in summaries {
        for (k, v) in &s.skipped {
            *skipped.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &s.skipped_examples {
            let e = examples.entry(k.clone()).or_default();
            e.extend(v.iter().take(5usize.saturating_sub(e.len())).cloned());
        }
    }
    let stitched = recipe.stitches_tails();
    let real = &summaries[..summaries.len() - stitched as usize];
    Totals {
        num_local_cells: cells,
        num_documents: real.iter().map(|s| s.num_documents).sum(),
        num_tokens: real.iter().map(|s| s.num_tokens).sum(),
        num_padding_tokens: summaries.iter().flat_map(|s| s.padded.iter().map(|p| p.1 as u64)).sum(),
        dropped_tokens: real.iter().map(|s| s.dropped_tokens).sum(),
        empty_documents: real.iter().map(|s| s.empty_documents).sum(),
        blank_lines: real.iter().map(|s| s.blank_lines).sum(),
        text_bytes: real.iter().map(|s| s.text_bytes).sum(),
        bytes_in: recipe.inputs.iter().map(|f| f.bytes).sum(),
        skipped,
        skipped_examples: examples,
        packing_stats: (!recipe.packing.is_concat()).then(|| {
            let contexts: u64 = summaries.iter().map(|s| s.num_contexts).sum();
            let padding: u64 = summaries.iter().flat_map(|s| s.padded.iter().map(|p| p.1 as u64)).sum();
            PackingFigures {
                mode: recipe.packing,
                padding_fraction: if contexts == 0 { 0.0 } else { padding as f64 / (contexts * recipe.seqlen as u64) as f64 },
                documents_split: real.iter().map(|s| s.documents_split).sum(),
                concat_documents_split: real.iter().map(|s| s.concat_documents_split).sum(),
            }
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(given: &[PathBuf]) -> (Vec<String>, Option<PathBuf>) {
        let (inputs, root) = input_files(given).unwrap();
        (inputs.into_iter().map(|f| f.path).collect(), root)
    }

    #[test]
    fn local_inputs_are_recorded_relative_to_their_common_folder() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().canonicalize().unwrap();
        std::fs::create_dir_all(base.join("corpus/web")).unwrap();
        for f in ["corpus/web/b.jsonl", "corpus/a.jsonl"] {
            std::fs::write(base.join(f), "{}\n").unwrap();
        }
        std::os::unix::fs::symlink(base.join("corpus"), base.join("link")).unwrap();
        let abs = names(&[base.join("corpus/web/b.jsonl"), base.join("corpus/a.jsonl")]);
        assert_eq!(abs.0, ["a.jsonl", "web/b.jsonl"]);
        assert_eq!(abs.1.as_deref(), Some(base.join("corpus").as_path()));
        // Spelled with `..` and `.`, or through a symlinked folder: the same record.
        let dotted = names(&[base.join("corpus/web/../web/./b.jsonl"), base.join("corpus/a.jsonl")]);
        assert_eq!(dotted.0, abs.0);
        let linked = names(&[base.join("link/web/b.jsonl"), base.join("link/a.jsonl")]);
        assert_eq!(linked.0, abs.0);
        assert_eq!(linked.1.as_deref(), Some(base.join("link").as_path()));
        // One file: relative to its own folder; the same file twice: once.
        assert_eq!(names(&[base.join("corpus/a.jsonl"), base.join("corpus/a.jsonl")]).0, ["a.jsonl"]);
    }

    #[test]
    fn a_missing_input_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.jsonl");
        match input_files(std::slice::from_ref(&missing)) {
            Err(Error::Io { path, .. }) => assert_eq!(path, missing),
            other => panic!("{:?}", other.map(|r| r.0)),
        }
    }
}

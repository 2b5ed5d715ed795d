//! The fast backend's tables of a tokenizer.json, saved on disk under the SHA-256 of the
//! file, so that a process loads them rather than parsing the file: finding the ids of
//! GPT-NeoX's 50 k merges in its vocabulary is most of its load, which is a quarter of a
//! build of one 10 MB file, and every process (each Ray worker, each `python -m tokshuf`)
//! pays it again. What is saved holds no string of the file: each merge's ids, each token's
//! bytes and id, the added tokens, the pre-tokenizer's pattern, and the ids the load found.
//!
//! The folder is `$TOKSHUF_TOKENIZER_CACHE` (empty: save nothing), else
//! `$XDG_CACHE_HOME/tokshuf/tokenizers`, else `~/.cache/tokshuf/tokenizers`. A file is named
//! by the tokenizer.json's SHA-256 and a hash of the tokenizers' source code (`build.rs`), so
//! no build of other tokenizer code reads it; it is written under a temporary name and
//! renamed (readers see a whole file or none), and ends in a CRC-32 of the rest: one that is
//! torn, truncated or edited by hand is ignored and written again. Saving removes the same
//! file's tables saved by other code. A folder that cannot be written only costs the time
//! saved.
//!
//! Layout: a line of JSON (`Head`), then little-endian u32s (the 256 byte ids, then
//! left/right/merged of each merge by rank, then end/id of each token), the tokens' bytes,
//! and the CRC-32 of all that precedes it.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::fast::JsonTables;
use super::hf_json::AddedToken;
use super::hfbpe::MergeSource;
use super::pretok::Pattern;

/// The hash of the tokenizers' source this build was made from.
const SOURCE: &str = env!("TOKSHUF_TOKENIZE_SOURCE");

/// A tokenizer.json's tables and what its load found: all `load_tokenizer_json` needs.
pub struct Saved {
    pub tables: JsonTables,
    /// End of text, padding, beginning of text.
    pub special_ids: [Option<u32>; 3],
    pub vocab_size: u32,
}

#[derive(Serialize, Deserialize)]
struct Head {
    source: String,
    sha256: String,
    nfc: bool,
    pattern: Pattern,
    ignore_merges: bool,
    added: Vec<(u32, AddedToken)>,
    special_ids: [Option<u32>; 3],
    vocab_size: u32,
    merges: usize,
    tokens: usize,
}

/// The folder tables are saved in, if any (see the module's notes).
pub fn folder() -> Option<PathBuf> {
    // Unit tests that save tables name their own folder: none writes to the home folder.
    if cfg!(test) {
        return None;
    }
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    match std::env::var_os("TOKSHUF_TOKENIZER_CACHE") {
        Some(v) if v.is_empty() => None,
        Some(v) => Some(PathBuf::from(v)),
        None => var("XDG_CACHE_HOME").or_else(|| var("HOME").map(|h| h.join(".cache"))).map(|c| c.join("tokshuf").join("tokenizers")),
    }
}

fn path(folder: &Path, sha256: &str) -> PathBuf {
    folder.join(format!("{sha256}.{SOURCE}.tables"))
}

/// Save `saved`, the tables of the tokenizer.json of SHA-256 `sha256`; failures are ignored
/// (the next load parses the file again).
pub fn save(folder: &Path, sha256: &str, saved: &Saved) {
    let Some(bytes) = encode(sha256, saved) else { return };
    let write = || -> std::io::Result<()> {
        std::fs::create_dir_all(folder)?;
        let mut tmp = tempfile::NamedTempFile::new_in(folder)?;
        tmp.write_all(&bytes)?;
        let kept = path(folder, sha256);
        tmp.persist(&kept).map_err(|e| e.error)?;
        // The same file's tables saved by other code (an older tokshuf) would only take room.
        for entry in std::fs::read_dir(folder)?.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(sha256) && name.ends_with(".tables") && entry.path() != kept {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        Ok(())
    };
    let _ = write();
}

/// The tables saved for the tokenizer.json of SHA-256 `sha256`, if whole and of this code.
pub fn load(folder: &Path, sha256: &str) -> Option<Saved> {
    decode(sha256, &std::fs::read(path(folder, sha256)).ok()?)
}

fn encode(sha256: &str, saved: &Saved) -> Option<Vec<u8>> {
    let Saved { tables, special_ids, vocab_size } = saved;
    let source = &tables.source;
    let head = Head {
        source: SOURCE.into(),
        sha256: sha256.into(),
        nfc: tables.nfc,
        pattern: tables.pattern,
        ignore_merges: source.ignore_merges,
        added: tables.added.clone(),
        special_ids: *special_ids,
        vocab_size: *vocab_size,
        merges: source.merges.len(),
        tokens: source.tokens.len(),
    };
    let mut out = serde_json::to_vec(&head).ok()?;
    out.push(b'\n');
    let words = source.byte_ids.iter().chain(source.merges.iter().flatten());
    out.reserve(4 * (256 + 3 * source.merges.len() + 2 * source.tokens.len()) + source.token_bytes.len() + 4);
    for w in words {
        out.extend_from_slice(&w.to_le_bytes());
    }
    for &(end, id) in &source.tokens {
        out.extend_from_slice(&u32::try_from(end).ok()?.to_le_bytes());
        out.extend_from_slice(&id.to_le_bytes());
    }
    out.extend_from_slice(&source.token_bytes);
    out.extend_from_slice(&crc32fast::hash(&out).to_le_bytes());
    Some(out)
}

fn decode(sha256: &str, bytes: &[u8]) -> Option<Saved> {
    let (body, crc) = bytes.split_at_checked(bytes.len().checked_sub(4)?)?;
    if crc32fast::hash(body).to_le_bytes() != crc {
        return None;
    }
    let line = memchr::memchr(b'\n', body)?;
    let head: Head = serde_json::from_slice(&body[..line]).ok()?;
    if head.source != SOURCE || head.sha256 != sha256 {
        return None;
    }
    // The u32s, then the tokens' bytes: all that is left.
    let n_words = head.merges.checked_mul(3)?.checked_add(256)?.checked_add(head.tokens.checked_mul(2)?)?;
    let (words, token_bytes) = body[line + 1..].split_at_checked(n_words.checked_mul(4)?)?;
    let (byte_words, words) = words.split_at(256 * 4);
    let (merge_words, token_words) = words.split_at(head.merges * 12);
    let mut byte_ids = [0u32; 256];
    byte_ids.iter_mut().zip(byte_words.chunks_exact(4)).for_each(|(id, w)| *id = word(w, 0));
    let merges: Vec<[u32; 3]> = merge_words.chunks_exact(12).map(|m| [word(m, 0), word(m, 4), word(m, 8)]).collect();
    let tokens: Vec<(usize, u32)> = token_words.chunks_exact(8).map(|t| (word(t, 0) as usize, word(t, 4))).collect();
    // Each token's bytes lie after the last's, within the bytes.
    let mut start = 0;
    for &(end, _) in &tokens {
        if end < start || end > token_bytes.len() {
            return None;
        }
        start = end;
    }
    let source = MergeSource { byte_ids, merges, token_bytes: token_bytes.to_vec(), tokens, ignore_merges: head.ignore_merges };
    let tables = JsonTables { nfc: head.nfc, pattern: head.pattern, source, added: head.added };
    Some(Saved { tables, special_ids: head.special_ids, vocab_size: head.vocab_size })
}

fn word(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::{json, Value};

    use super::*;
    use crate::tokenize::tokenizer_json::{load_saving_tables, JsonFile};
    use crate::tokenize::{Backend, Tokenizer};

    fn neox() -> Value {
        serde_json::from_slice(&std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/gpt-neox-20b.json")).unwrap()).unwrap()
    }

    /// GPT-NeoX's file, and others of its family that the fast backend models in other ways.
    fn variants() -> Vec<(&'static str, Value)> {
        let mut llama3 = neox();
        llama3["normalizer"] = Value::Null;
        llama3["model"]["ignore_merges"] = true.into();
        llama3["pre_tokenizer"] = json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": crate::tokenize::pretok::LLAMA3}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]});
        let mut added = neox();
        added["normalizer"] = json!({"type": "NFC"});
        for (k, (content, special, normalized)) in
            [("<ctl>", true, false), ("é!", false, true), ("raw-tok", false, false)].into_iter().enumerate()
        {
            added["added_tokens"].as_array_mut().unwrap().push(json!({"id": 50277 + k, "content": content, "single_word": false,
                "lstrip": false, "rstrip": false, "normalized": normalized, "special": special}));
        }
        vec![("neox", neox()), ("llama3", llama3), ("added", added)]
    }

    const TEXTS: [&str; 4] = [
        "Hello WORLD's 12345 ١٢٣٤ 中文 Ωmega\r\n\t x   ",
        "<ctl> é! e\u{301}! raw-tokraw-tok <|endoftext|> don'T stop\n\n  now",
        "    def f(x):\n        return x ** 2  # squared\n",
        "",
    ];

    fn load(file: &Path, tables: Option<&Path>, allow_special: bool) -> Tokenizer {
        load_saving_tables("t", JsonFile::read(file).unwrap(), allow_special, Backend::Auto, tables).unwrap()
    }

    /// What a tokenizer is to a build: its identity and its ids.
    type Seen = (String, u32, &'static str, [Option<u32>; 3], Vec<Vec<u32>>);

    fn seen(t: &Tokenizer) -> Seen {
        let ids = TEXTS.iter().map(|s| t.encode(s).unwrap()).collect();
        (t.sha256.clone(), t.vocab_size, t.backend, [t.eot_id, t.pad_id, t.bos_id], ids)
    }

    fn saved_file(folder: &Path) -> PathBuf {
        let files: Vec<_> = std::fs::read_dir(folder).unwrap().map(|e| e.unwrap().path()).collect();
        assert_eq!(files.len(), 1, "{files:?}");
        files[0].clone()
    }

    /// A load that saves the tables and one that reads them make the same tokenizer as a load
    /// without them, with or without special tokens allowed.
    #[test]
    fn tables_saved_by_one_load_make_the_same_tokenizer_for_the_next() {
        for (name, json) in variants() {
            let dir = tempfile::tempdir().unwrap();
            let (file, folder) = (dir.path().join("tokenizer.json"), dir.path().join("tables"));
            std::fs::write(&file, serde_json::to_vec(&json).unwrap()).unwrap();
            for allow_special in [false, true] {
                let plain = load(&file, None, allow_special);
                assert_eq!(plain.backend, crate::tokenize::FAST_BACKEND, "{name}");
                let saving = load(&file, Some(&folder), allow_special);
                let written = std::fs::metadata(saved_file(&folder)).unwrap().modified().unwrap();
                let reading = load(&file, Some(&folder), allow_special);
                assert_eq!(std::fs::metadata(saved_file(&folder)).unwrap().modified().unwrap(), written, "{name}: read, not saved again");
                assert_eq!(seen(&saving), seen(&plain), "{name}, allow_special {allow_special}");
                assert_eq!(seen(&reading), seen(&plain), "{name}, allow_special {allow_special}");
            }
        }
    }

    /// The file is saved under a CRC of its bytes; rewrite one with another CRC.
    fn rewrite(path: &Path, edit: impl FnOnce(&mut Vec<u8>)) {
        let bytes = std::fs::read(path).unwrap();
        let mut body = bytes[..bytes.len() - 4].to_vec();
        edit(&mut body);
        body.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        std::fs::write(path, body).unwrap();
    }

    /// A load takes what the saved file says (here a vocabulary size edited by hand, its CRC
    /// made again), not what the tokenizer.json would give.
    #[test]
    fn a_load_takes_the_saved_tables() {
        let dir = tempfile::tempdir().unwrap();
        let (file, folder) = (dir.path().join("tokenizer.json"), dir.path().join("tables"));
        std::fs::write(&file, serde_json::to_vec(&neox()).unwrap()).unwrap();
        assert_eq!(load(&file, Some(&folder), false).vocab_size, 50277);
        rewrite(&saved_file(&folder), |body| {
            let at = memchr::memmem::find(body, b"\"vocab_size\":50277").unwrap();
            body.splice(at..at + 18, b"\"vocab_size\":60000".iter().copied());
        });
        assert_eq!(load(&file, Some(&folder), false).vocab_size, 60000);
    }

    /// Files torn, cut short, edited (a byte flipped, ids out of order) or saved by other code
    /// are ignored and saved again; a folder that cannot be written is no error.
    #[test]
    fn damaged_tables_are_ignored_and_saved_again() {
        let dir = tempfile::tempdir().unwrap();
        let (file, folder) = (dir.path().join("tokenizer.json"), dir.path().join("tables"));
        std::fs::write(&file, serde_json::to_vec(&neox()).unwrap()).unwrap();
        let want = seen(&load(&file, None, false));
        load(&file, Some(&folder), false);
        let path = saved_file(&folder);
        let good = std::fs::read(&path).unwrap();
        let sha256 = want.0.clone();
        assert!(load_tables(&folder, &sha256).is_some());
        type Damage<'a> = Box<dyn Fn(&Path) + 'a>;
        let damages: Vec<(&str, Damage)> = vec![
            ("empty", Box::new(|p| std::fs::write(p, b"").unwrap())),
            ("cut short", Box::new(|p| std::fs::write(p, &good[..good.len() / 2]).unwrap())),
            (
                "a byte flipped",
                Box::new(|p| {
                    let mut b = good.clone();
                    b[good.len() / 3] ^= 1;
                    std::fs::write(p, b).unwrap()
                }),
            ),
            (
                "a token ending past the bytes",
                Box::new(|p| {
                    rewrite(p, |body| {
                        let line = memchr::memchr(b'\n', body).unwrap();
                        let head: Head = serde_json::from_slice(&body[..line]).unwrap();
                        // The second token's end.
                        let at = line + 1 + 4 * 256 + 12 * head.merges + 8;
                        body[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
                    })
                }),
            ),
            (
                "other code",
                Box::new(|p| {
                    rewrite(p, |body| {
                        let at = memchr::memmem::find(body, SOURCE.as_bytes()).unwrap();
                        body[at] ^= 1;
                    })
                }),
            ),
        ];
        for (what, damage) in damages {
            damage(&path);
            assert!(load_tables(&folder, &sha256).is_none(), "{what}");
            assert_eq!(seen(&load(&file, Some(&folder), false)), want, "{what}");
            assert!(load_tables(&folder, &sha256).is_some(), "{what}: saved again");
        }
        // Saving removes what other code saved for the same file.
        let other = folder.join(format!("{sha256}.0123456789abcdef.tables"));
        std::fs::write(&other, &good).unwrap();
        std::fs::remove_file(&path).unwrap();
        load(&file, Some(&folder), false);
        assert!(!other.exists() && load_tables(&folder, &sha256).is_some());
        let not_a_folder = dir.path().join("tokenizer.json");
        assert_eq!(seen(&load(&file, Some(&not_a_folder), false)), want);
    }

    fn load_tables(folder: &Path, sha256: &str) -> Option<Saved> {
        super::load(folder, sha256)
    }
}

//! A hash of the tokenizers' source (`src/tokenize`), which names the tables
//! `tokenize::saved_tables` keeps on disk: a build whose tokenizer code differs in any way
//! never reads tables another one saved.
//!
//! The embedded tiktoken encodings: `data/NAME.tiktoken.gz` (tiktoken's own files, as
//! published) turned into `OUT_DIR/NAME.tokens`, each rank's token as a length byte and its
//! bytes, a zero length for a rank without a token. Loading an encoding then neither inflates
//! nor decodes base64, which was two thirds of its time (docs/performance.md, round
//! twelve). `tokenize::tiktoken`'s tests rebuild the published text from these bytes and
//! check its sha256.

use std::io::Read;
use std::path::PathBuf;

const NAMES: [&str; 4] = ["r50k_base", "p50k_base", "cl100k_base", "o200k_base"];

fn base64_decode(s: &[u8]) -> Vec<u8> {
    const DIGITS: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let value = |c: u8| DIGITS.iter().position(|&d| d == c).unwrap_or_else(|| panic!("not base64: {c:#04x}")) as u32;
    let s = &s[..s.iter().rposition(|&c| c != b'=').map_or(0, |i| i + 1)];
    let mut out = Vec::new();
    for chunk in s.chunks(4) {
        let acc = chunk.iter().enumerate().fold(0u32, |acc, (i, &c)| acc | value(c) << (18 - 6 * i));
        out.extend_from_slice(&acc.to_be_bytes()[1..chunk.len()]);
    }
    out
}

/// FNV-1a of every file under `dir`, in order of path, names included.
fn source_hash(dir: &std::path::Path, hash: &mut u64) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir).expect("src/tokenize").map(|e| e.expect("src/tokenize").path()).collect();
    entries.sort();
    let feed = |hash: &mut u64, bytes: &[u8]| bytes.iter().for_each(|&b| *hash = (*hash ^ b as u64).wrapping_mul(0x100_0000_01b3));
    for path in entries {
        feed(hash, path.to_string_lossy().as_bytes());
        if path.is_dir() {
            source_hash(&path, hash);
        } else {
            feed(hash, &std::fs::read(&path).expect("src/tokenize"));
        }
    }
}

fn main() {
    println!("cargo:rerun-if-changed=src/tokenize");
    let mut hash = 0xcbf2_9ce4_8422_2325;
    source_hash(std::path::Path::new("src/tokenize"), &mut hash);
    println!("cargo:rustc-env=TOKSHUF_TOKENIZE_SOURCE={hash:016x}");
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    for name in NAMES {
        let src = format!("data/{name}.tiktoken.gz");
        println!("cargo:rerun-if-changed={src}");
        let mut text = Vec::new();
        let file = std::fs::File::open(&src).unwrap_or_else(|e| panic!("{src}: {e}"));
        flate2::read::GzDecoder::new(file).read_to_end(&mut text).unwrap_or_else(|e| panic!("{src}: {e}"));
        let mut tokens = Vec::with_capacity(text.len());
        let mut next_rank = 0u64;
        for line in text.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            let (b64, rank) = line.split_at(line.iter().position(|&b| b == b' ').unwrap_or_else(|| panic!("{src}: no space")));
            let rank: u64 = std::str::from_utf8(&rank[1..]).ok().and_then(|r| r.parse().ok()).unwrap_or_else(|| panic!("{src}: bad rank"));
            assert!(rank >= next_rank, "{src}: ranks must increase");
            tokens.resize(tokens.len() + (rank - next_rank) as usize, 0);
            let bytes = base64_decode(b64);
            assert!((1..=255).contains(&bytes.len()), "{src}: a token of {} bytes", bytes.len());
            tokens.push(bytes.len() as u8);
            tokens.extend_from_slice(&bytes);
            next_rank = rank + 1;
        }
        std::fs::write(out_dir.join(format!("{name}.tokens")), tokens).expect("OUT_DIR is writable");
    }
}

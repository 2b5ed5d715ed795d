//! Streaming input: open `.jsonl`, `.jsonl.gz` (multi-member) and `.jsonl.zst` (multi-frame)
//! files, read them line by line without ever holding a whole file, and pull the text field
//! out of one JSON line without building a JSON tree (only the text value is materialised).

use std::borrow::Cow;
use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::error::{Error, Result, SkipReason};

/// The read buffer of an input that a build reads alone (`open`'s `buffer`).
pub const BUFFER: usize = 1 << 20;

/// An opened input: its decoded bytes, and about how much memory its buffers and decoder may
/// hold once reading starts, for a build that reads many files at once to count.
pub struct Opened {
    pub reader: Box<dyn BufRead + Send>,
    pub memory: u64,
}

impl Opened {
    /// An input with nothing in it.
    pub fn empty() -> Self {
        Opened { reader: Box::new(BufReader::new(std::io::empty())), memory: 0 }
    }
}

/// Open an input file, choosing the decoder from its name, read through a buffer of `buffer`
/// bytes. A decoding failure names the compressed byte offset the decoder had reached (within
/// one read buffer of the damage). `listed`: the size the build listed it with; a file of
/// another size when opened or read to its end changed since, and reading it fails
/// (`changed`) rather than build from other data than the recipe records.
pub fn open(path: &Path, listed: Option<u64>, buffer: usize) -> Result<Opened> {
    if let Some(url) = path.to_str().filter(|s| crate::storage::Location::is_url(s)) {
        return crate::storage::open_input(url, listed, buffer);
    }
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let md = file.metadata().map_err(|e| Error::io(path, e))?;
    if md.is_dir() {
        return Err(Error::io(path, std::io::Error::other("is a directory")));
    }
    if let Some(n) = listed.filter(|&n| n != md.len()) {
        return Err(changed(&path.to_string_lossy(), n, md.len()));
    }
    // An empty file holds no lines whatever its name says (Python's gzip module agrees); only
    // a non-empty file must be a valid stream.
    if md.is_file() && md.len() == 0 {
        return Ok(Opened::empty());
    }
    let pos = Arc::new(AtomicU64::new(0));
    let counted = Counting { inner: file, pos: pos.clone(), listed: listed.map(|n| (n, path.to_string_lossy().into_owned())) };
    decode(&path.to_string_lossy(), Box::new(counted), Some((pos, md.len())), buffer)
}

/// The error of an input whose size is no longer the one the build listed it with.
pub fn changed(name: &str, listed: u64, now: u64) -> Error {
    Error::io(
        name,
        std::io::Error::other(format!(
            "changed while the build ran: listed with {listed} bytes, {now} now (start the build again once the inputs stay put)"
        )),
    )
}

/// `raw` decoded as its name asks: `.gz` (every member, zero padding between and after them
/// skipped, as `gzip -d` and Python's gzip module do), `.zst`/`.zstd` (every frame), else as
/// is; a plain file that holds gzip or zstd data fails at its first read (it is not JSON, and
/// one clear error beats a count of undecodable lines). `at`: the compressed position and
/// size, for decoding errors to name.
pub fn decode(name: &str, raw: Box<dyn Read + Send>, at: Option<(Arc<AtomicU64>, u64)>, buffer: usize) -> Result<Opened> {
    let (decoded, memory): (Box<dyn Read + Send>, u64) = if name.ends_with(".gz") {
        (Box::new(GzMembers::new(BufReader::new(raw))), GZIP_MEMORY)
    } else if name.ends_with(".zst") || name.ends_with(".zstd") {
        // Any frame may declare the largest window (a first frame's is no promise for the
        // rest: `cat small.zst long.zst`), so that is what a zstd file counts.
        let decoder = zstd::stream::read::Decoder::new(raw).map_err(|e| Error::io(name, e))?;
        (Box::new(decoder), ZSTD_MAX_WINDOW + ZSTD_MEMORY)
    } else {
        let reader = NotCompressed { inner: BufReader::with_capacity(buffer, raw), checked: false };
        return Ok(Opened { reader: Box::new(reader), memory: buffer as u64 });
    };
    let reader: Box<dyn BufRead + Send> = match at {
        Some((pos, size)) => Box::new(BufReader::with_capacity(buffer, ErrorAt { inner: decoded, pos, size })),
        None => Box::new(BufReader::with_capacity(buffer, decoded)),
    };
    Ok(Opened { reader, memory: buffer as u64 + memory })
}

/// What a gzip decoder holds besides its window's 32 KiB: its state and input buffer.
const GZIP_MEMORY: u64 = 64 << 10;
/// What a zstd decoder holds besides its window: its context, input buffer and two blocks.
const ZSTD_MEMORY: u64 = 512 << 10;
/// The largest window zstd decodes without being told to (`ZSTD_WINDOWLOG_LIMIT_DEFAULT`).
const ZSTD_MAX_WINDOW: u64 = 1 << 27;

/// The members of a gzip stream one after another. Zero bytes after a member (tape or block
/// padding) are skipped; anything else there must be the next member.
struct GzMembers<R: BufRead> {
    member: Option<flate2::bufread::GzDecoder<R>>,
}

impl<R: BufRead> GzMembers<R> {
    fn new(inner: R) -> Self {
        GzMembers { member: Some(flate2::bufread::GzDecoder::new(inner)) }
    }
}

impl<R: BufRead> Read for GzMembers<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let Some(member) = self.member.as_mut() else { return Ok(0) };
            let n = member.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            let Some(mut inner) = self.member.take().map(|m| m.into_inner()) else { return Ok(0) };
            loop {
                let avail = inner.fill_buf()?;
                if avail.is_empty() {
                    return Ok(0);
                }
                let zeros = avail.iter().take_while(|&&b| b == 0).count();
                if zeros == 0 {
                    break;
                }
                inner.consume(zeros);
            }
            self.member = Some(flate2::bufread::GzDecoder::new(inner));
        }
    }
}

/// A stream named as plain text whose first bytes are checked for a gzip or zstd header.
struct NotCompressed<R> {
    inner: R,
    checked: bool,
}

impl<R: BufRead> BufRead for NotCompressed<R> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        if !self.checked {
            let head = self.inner.fill_buf()?;
            for (magic, what, suffix) in [(&b"\x1f\x8b"[..], "gzip", ".gz"), (&b"\x28\xb5\x2f\xfd"[..], "zstd", ".zst")] {
                if head.starts_with(magic) {
                    return Err(std::io::Error::other(format!(
                        "the file holds {what}-compressed data but its name does not end in {suffix}"
                    )));
                }
            }
            self.checked = true;
        }
        self.inner.fill_buf()
    }
    fn consume(&mut self, n: usize) {
        self.inner.consume(n)
    }
}

impl<R: BufRead> Read for NotCompressed<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let avail = self.fill_buf()?;
        let n = avail.len().min(buf.len());
        buf[..n].copy_from_slice(&avail[..n]);
        self.consume(n);
        Ok(n)
    }
}

/// Counts the bytes read from the (compressed) file.
struct Counting<R> {
    inner: R,
    pos: Arc<AtomicU64>,
    /// The size the build listed the file with, and its name: its end must come there.
    listed: Option<(u64, String)>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        let pos = self.pos.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
        if let Some((listed, name)) = &self.listed {
            if (n == 0 && !buf.is_empty() && pos != *listed) || pos > *listed {
                // Carried as the crate's error, which readers of the stream pass on as it is.
                return Err(std::io::Error::other(changed(name, *listed, pos)));
            }
        }
        Ok(n)
    }
}

/// Adds the compressed position to a decoder's errors.
struct ErrorAt<R> {
    inner: R,
    pos: Arc<AtomicU64>,
    size: u64,
}

impl<R: Read> Read for ErrorAt<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.inner.read(buf).map_err(|e| {
            if e.get_ref().is_some_and(|inner| inner.is::<Error>()) {
                return e; // not the decoder's: the crate's own error, passed on as it is
            }
            let at = self.pos.load(Ordering::Relaxed);
            std::io::Error::new(e.kind(), format!("{e} (decoder had read {at} of {} compressed bytes)", self.size))
        })
    }
}

/// Reads a stream into batches of whole lines (one buffer, many line ends: no per-line
/// allocation). A decoding failure is reported with the line it happened on, and so is a line
/// longer than `max_line` bytes (as `LineTooLong`), before more of it is held.
pub struct LineBatcher<R> {
    inner: R,
    pub next_line: u64,
    max_line: usize,
    eof: bool,
}

/// The error of a line longer than a build may hold.
#[derive(Debug)]
pub struct LineTooLong {
    pub max_line: usize,
}

impl fmt::Display for LineTooLong {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "a line longer than {} bytes", self.max_line)
    }
}

impl std::error::Error for LineTooLong {}

impl<R: BufRead> LineBatcher<R> {
    pub fn new(inner: R, max_line: usize) -> Self {
        LineBatcher { inner, next_line: 1, max_line, eof: false }
    }
    /// Fill `buf` with whole lines (ends recorded in `ends`) until about `target` bytes.
    /// Returns Ok(false) at end of stream with nothing read.
    pub fn fill(&mut self, buf: &mut Vec<u8>, ends: &mut Vec<usize>, target: usize) -> std::io::Result<bool> {
        buf.clear();
        ends.clear();
        while !self.eof && buf.len() < target {
            let start = buf.len();
            loop {
                let avail = match self.inner.fill_buf() {
                    Ok(avail) => avail,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                };
                if avail.is_empty() {
                    self.eof = true;
                    break;
                }
                let (take, ended) = match memchr::memchr(b'\n', avail) {
                    Some(i) => (i + 1, true),
                    None => (avail.len(), false),
                };
                buf.extend_from_slice(&avail[..take]);
                self.inner.consume(take);
                if buf.len() - start > self.max_line {
                    return Err(std::io::Error::other(LineTooLong { max_line: self.max_line }));
                }
                if ended {
                    break;
                }
            }
            if buf.len() == start {
                break;
            }
            if self.next_line == 1 && ends.is_empty() && buf.starts_with(b"\xEF\xBB\xBF") {
                buf.drain(..3); // a UTF-8 BOM is not part of the first JSON line
            }
            ends.push(buf.len());
            self.next_line += 1;
        }
        Ok(!ends.is_empty())
    }
}

impl<R: Read> LineBatcher<R> {
    pub fn into_inner(self) -> R {
        self.inner
    }
}

/// What one line holds.
#[derive(Debug, PartialEq)]
pub enum Line<'a> {
    Blank,
    Text(Cow<'a, str>),
    Bad(SkipReason, String),
}

/// Parse one line (without its trailing newline) and return its text field.
///
/// A line must be valid UTF-8 as a whole (RFC 8259, and what Python's `json.loads` of the
/// raw line demands), even where the bad bytes sit outside the text value.
pub fn parse_line<'a>(line: &'a [u8], key: &str) -> Line<'a> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().all(|b| b.is_ascii_whitespace()) {
        return Line::Blank;
    }
    // simdutf8 rather than std: about half the time on the corpus's lines (a tenth of
    // parsing them).
    let line = match simdutf8::compat::from_utf8(line) {
        Ok(s) => s,
        Err(e) => return Line::Bad(SkipReason::InvalidUtf8, format!("invalid UTF-8 at byte {} of the line", e.valid_up_to())),
    };
    // Validated above, so the str reader (which skips UTF-8 checks) is safe and faster.
    let mut de = serde_json::Deserializer::from_str(line);
    let parsed = TextSeed { key }.deserialize(&mut de).and_then(|v| de.end().map(|_| v));
    match parsed {
        Ok(Extracted::Text(t)) => Line::Text(t),
        Ok(Extracted::Missing) => Line::Bad(SkipReason::MissingText, format!("no {key:?} key")),
        Ok(Extracted::NotString(what)) => Line::Bad(SkipReason::TextNotString, format!("{key:?} is {what}, not a string")),
        Ok(Extracted::NotObject(what)) => Line::Bad(SkipReason::NotAnObject, format!("line is a JSON {what}, not an object")),
        Err(e) => {
            let msg = e.to_string();
            if msg.contains("surrogate") || msg.contains("hex escape") {
                // serde_json's words for a lone UTF-16 surrogate escape such as "\ud800".
                Line::Bad(SkipReason::InvalidUtf8, format!("a string holds a lone surrogate escape ({msg})"))
            } else if line.starts_with('\u{feff}') {
                Line::Bad(SkipReason::InvalidJson, format!("invalid JSON: a byte-order mark inside the file ({msg})"))
            } else {
                Line::Bad(SkipReason::InvalidJson, format!("invalid JSON ({msg})"))
            }
        }
    }
}

enum Extracted<'a> {
    Text(Cow<'a, str>),
    Missing,
    NotString(&'static str),
    NotObject(&'static str),
}

struct TextSeed<'k> {
    key: &'k str,
}

impl<'de> DeserializeSeed<'de> for TextSeed<'_> {
    type Value = Extracted<'de>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

/// Drains a sequence or map the caller does not want, so the parser stays in sync.
fn drain_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

impl<'de> Visitor<'de> for TextSeed<'_> {
    type Value = Extracted<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        // Duplicate keys: the last one wins, as in Python's json module.
        let mut found = Extracted::Missing;
        while let Some(is_text) = map.next_key_seed(KeySeed { key: self.key })? {
            if is_text {
                found = match map.next_value::<TextValue<'de>>()? {
                    TextValue(Ok(s)) => Extracted::Text(s),
                    TextValue(Err(what)) => Extracted::NotString(what),
                };
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        drain_seq(seq)?;
        Ok(Extracted::NotObject("list"))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Extracted::NotObject("boolean"))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Extracted::NotObject("number"))
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Extracted::NotObject("number"))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Extracted::NotObject("number"))
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Extracted::NotObject("string"))
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Extracted::NotObject("null"))
    }
}

struct KeySeed<'k> {
    key: &'k str,
}

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = bool;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_> {
    type Value = bool;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E>(self, v: &str) -> Result<bool, E> {
        Ok(v == self.key)
    }
}

/// The text value: a string (borrowed when it has no escapes) or the JSON type it was instead.
struct TextValue<'a>(std::result::Result<Cow<'a, str>, &'static str>);

impl<'de> de::Deserialize<'de> for TextValue<'de> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TextValueVisitor)
    }
}

struct TextValueVisitor;

impl<'de> Visitor<'de> for TextValueVisitor {
    type Value = TextValue<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(TextValue(Ok(Cow::Borrowed(v))))
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(TextValue(Ok(Cow::Owned(v.to_owned()))))
    }
    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(TextValue(Ok(Cow::Owned(v))))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(TextValue(Err("a boolean")))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(TextValue(Err("a number")))
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(TextValue(Err("a number")))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(TextValue(Err("a number")))
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(TextValue(Err("null")))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        drain_seq(seq)?;
        Ok(TextValue(Err("a list")))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(TextValue(Err("an object")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(line: &str) -> Line<'_> {
        parse_line(line.as_bytes(), "text")
    }

    #[test]
    fn extracts_text_and_classifies_bad_lines() {
        assert_eq!(text(r#"{"id": 1, "text": "hi", "x": [1, {"a": 2}]}"#), Line::Text("hi".into()));
        assert_eq!(text(r#"{"text": "a\nb"}"#), Line::Text("a\nb".into()));
        assert_eq!(text("{\"text\": \"x\"}\r"), Line::Text("x".into()));
        assert_eq!(text(r#"{"text": "a", "text": "b"}"#), Line::Text("b".into()));
        assert_eq!(text("  "), Line::Blank);
        assert!(matches!(text(r#"{"text": 1}"#), Line::Bad(SkipReason::TextNotString, _)));
        assert!(matches!(text(r#"{"text": null}"#), Line::Bad(SkipReason::TextNotString, _)));
        assert!(matches!(text(r#"{"text": ["a"]}"#), Line::Bad(SkipReason::TextNotString, _)));
        assert!(matches!(text(r#"{"other": "a"}"#), Line::Bad(SkipReason::MissingText, _)));
        assert!(matches!(text(r#"[1, 2]"#), Line::Bad(SkipReason::NotAnObject, _)));
        assert!(matches!(text(r#""text""#), Line::Bad(SkipReason::NotAnObject, _)));
        assert!(matches!(text(r#"{"text": "a""#), Line::Bad(SkipReason::InvalidJson, _)));
        assert!(matches!(text(r#"{"text": "a"} x"#), Line::Bad(SkipReason::InvalidJson, _)));
        assert!(matches!(text(r#"{"text": "\ud800"}"#), Line::Bad(SkipReason::InvalidUtf8, _)));
        assert!(matches!(parse_line(b"{\"text\": \"\xff\"}", "text"), Line::Bad(SkipReason::InvalidUtf8, _)));
        // Deep nesting is skipped over iteratively: no stack overflow, the text still found.
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(matches!(text(&deep), Line::Bad(SkipReason::NotAnObject, _)));
        let nested = format!(r#"{{"x": {}{}, "text": "ok"}}"#, "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(text(&nested), Line::Text("ok".into()));
    }

    #[test]
    fn whole_line_must_be_utf8_and_surrogates_only_matter_in_text() {
        // Bad bytes outside the text value still make the line bad (as json.loads would).
        assert!(matches!(parse_line(b"{\"x\": \"\xff\", \"text\": \"a\"}", "text"), Line::Bad(SkipReason::InvalidUtf8, _)));
        match parse_line(b"{\"text\": \"ab\xc3\"}", "text") {
            Line::Bad(SkipReason::InvalidUtf8, m) => assert!(m.contains("byte 12"), "{m}"),
            other => panic!("{other:?}"),
        }
        // A lone surrogate in a field nobody reads is tolerated, as by Python's json module.
        assert_eq!(text(r#"{"x": "\udc00", "text": "a"}"#), Line::Text("a".into()));
        assert!(matches!(text(r#"{"text": "\udc00"}"#), Line::Bad(SkipReason::InvalidUtf8, _)));
        assert!(matches!(text(r#"{"text": "\ud800x"}"#), Line::Bad(SkipReason::InvalidUtf8, _)));
        assert_eq!(text(r#"{"text": "\ud83d\ude00"}"#), Line::Text("\u{1F600}".into()));
        // Raw NUL is a control character inside a string; escaped NUL is text.
        assert!(matches!(parse_line(b"{\"text\": \"a\0b\"}", "text"), Line::Bad(SkipReason::InvalidJson, _)));
        assert_eq!(text(r#"{"text": "a\u0000b"}"#), Line::Text("a\0b".into()));
        // A BOM after the first line is not stripped.
        match parse_line("\u{feff}{\"text\": \"a\"}".as_bytes(), "text") {
            Line::Bad(SkipReason::InvalidJson, m) => assert!(m.contains("byte-order mark"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bom_is_stripped_from_the_first_line_only() {
        let data = b"\xEF\xBB\xBF{\"text\": \"a\"}\r\n\xEF\xBB\xBF{\"text\": \"b\"}".to_vec();
        let mut lines = LineBatcher::new(&data[..], 1 << 20);
        let (mut buf, mut ends) = (Vec::new(), Vec::new());
        assert!(lines.fill(&mut buf, &mut ends, 1 << 20).unwrap());
        assert_eq!(ends.len(), 2);
        assert_eq!(parse_line(buf[..ends[0]].strip_suffix(b"\n").unwrap(), "text"), Line::Text("a".into()));
        assert!(matches!(parse_line(&buf[ends[0]..ends[1]], "text"), Line::Bad(SkipReason::InvalidJson, _)));
    }

    #[test]
    fn a_line_longer_than_the_limit_is_an_error_at_its_number_before_more_is_held() {
        let data = [&b"{\"text\": \"a\"}\n"[..], &[b'x'; 5000][..], b"\n"].concat();
        let mut lines = LineBatcher::new(std::io::BufReader::with_capacity(64, &data[..]), 1000);
        let (mut buf, mut ends) = (Vec::new(), Vec::new());
        let err = lines.fill(&mut buf, &mut ends, 1 << 20).unwrap_err();
        assert!(err.get_ref().is_some_and(|e| e.is::<LineTooLong>()), "{err}");
        assert_eq!((ends.len(), lines.next_line), (1, 2));
        assert!(buf.len() <= 1100, "{}", buf.len());
    }

    #[test]
    fn empty_compressed_files_are_empty_and_truncated_ones_say_where() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["a.jsonl.gz", "a.jsonl.zst", "a.jsonl"] {
            let p = dir.path().join(name);
            std::fs::write(&p, b"").unwrap();
            let mut out = Vec::new();
            open(&p, None, BUFFER).unwrap().reader.read_to_end(&mut out).unwrap();
            assert!(out.is_empty());
        }
        let payload: Vec<u8> = (0..2000).flat_map(|i| format!("{{\"text\": \"doc {i}\"}}\n").into_bytes()).collect();
        let z = zstd::encode_all(&payload[..], 3).unwrap();
        let p = dir.path().join("t.jsonl.zst");
        std::fs::write(&p, &z[..z.len() - 3]).unwrap();
        let err = open(&p, None, BUFFER).unwrap().reader.read_to_end(&mut Vec::new()).unwrap_err();
        assert!(err.to_string().contains(&format!("of {} compressed bytes", z.len() - 3)), "{err}");
    }

    #[test]
    fn a_file_of_another_size_than_listed_is_refused_when_opened_or_read_to_its_end() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let payload: Vec<u8> = (0..5000).flat_map(|i| format!("{{\"text\": \"doc {i}\"}}\n").into_bytes()).collect();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&payload).unwrap();
        let gz = gz.finish().unwrap();
        for (name, data) in [("a.jsonl", payload.clone()), ("a.jsonl.gz", gz), ("a.jsonl.zst", zstd::encode_all(&payload[..], 3).unwrap())]
        {
            let p = dir.path().join(name);
            std::fs::write(&p, &data).unwrap();
            let n = data.len() as u64;
            let mut out = Vec::new();
            open(&p, Some(n), BUFFER).unwrap().reader.read_to_end(&mut out).unwrap();
            assert_eq!(out, payload, "{name}: the listed size reads as ever");
            let err = open(&p, Some(n + 1), BUFFER).err().expect("another size at open");
            assert!(err.to_string().contains(&format!("listed with {} bytes, {n} now", n + 1)), "{err}");
            // Grown after it was opened (an append: the same stream, then more).
            let mut r = open(&p, Some(n), BUFFER).unwrap().reader;
            std::fs::OpenOptions::new().append(true).open(&p).unwrap().write_all(&data).unwrap();
            let err = r.read_to_end(&mut Vec::new()).unwrap_err();
            let inner = crate::storage::unwrap_io(&crate::storage::Location::Local(p.clone()), err);
            assert!(matches!(&inner, Error::Io { .. }) && inner.to_string().contains("changed while the build ran"), "{name}: {inner}");
        }
    }

    #[test]
    fn an_opened_file_counts_its_decoders_memory() {
        let dir = tempfile::tempdir().unwrap();
        let data = b"{\"text\": \"hello\"}\n".repeat(1000);
        let memory = |name: &str, bytes: &[u8]| {
            let p = dir.path().join(name);
            std::fs::write(&p, bytes).unwrap();
            let mut opened = open(&p, None, 4096).unwrap();
            let mut out = Vec::new();
            opened.reader.read_to_end(&mut out).unwrap();
            assert_eq!(out, data, "{name}");
            opened.memory
        };
        assert_eq!(memory("a.jsonl", &data), 4096);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        std::io::Write::write_all(&mut gz, &data).unwrap();
        assert_eq!(memory("a.jsonl.gz", &gz.finish().unwrap()), 4096 + GZIP_MEMORY);
        let z = zstd::bulk::compress(&data, 3).unwrap();
        assert_eq!(memory("a.jsonl.zst", &z), 4096 + ZSTD_MEMORY + ZSTD_MAX_WINDOW);
    }
}

//! Streaming input: open `.jsonl`, `.jsonl.gz` (multi-member) and `.jsonl.zst` (multi-frame)
//! files, read them line by line without ever holding a whole file, and pull the text field
//! out of one JSON line without building a JSON tree (only the text value is materialised).

use std::borrow::Cow;
use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::error::{Error, Result, SkipReason};

/// Open an input file, choosing the decoder from its name.
pub fn open(path: &Path) -> Result<Box<dyn BufRead + Send>> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    if file.metadata().map(|m| m.is_dir()).unwrap_or(false) {
        return Err(Error::io(path, std::io::Error::other("is a directory")));
    }
    let name = path.to_string_lossy();
    const CAP: usize = 1 << 20;
    let reader: Box<dyn BufRead + Send> = if name.ends_with(".gz") {
        Box::new(BufReader::with_capacity(CAP, flate2::bufread::MultiGzDecoder::new(BufReader::new(file))))
    } else if name.ends_with(".zst") || name.ends_with(".zstd") {
        let dec = zstd::stream::read::Decoder::new(file).map_err(|e| Error::io(path, e))?;
        Box::new(BufReader::with_capacity(CAP, dec))
    } else {
        Box::new(BufReader::with_capacity(CAP, file))
    };
    Ok(reader)
}

/// True for the names `build_cache` accepts as input files.
pub fn is_input_name(name: &str) -> bool {
    [".jsonl", ".jsonl.gz", ".jsonl.zst", ".jsonl.zstd"].iter().any(|s| name.ends_with(s))
}

/// Reads a stream into batches of whole lines (one buffer, many line ends: no per-line
/// allocation). A decoding failure is reported with the line it happened on.
pub struct LineBatcher<R> {
    inner: R,
    pub next_line: u64,
    pub bytes_read: u64,
    eof: bool,
}

impl<R: BufRead> LineBatcher<R> {
    pub fn new(inner: R) -> Self {
        LineBatcher { inner, next_line: 1, bytes_read: 0, eof: false }
    }
    /// Fill `buf` with whole lines (ends recorded in `ends`) until about `target` bytes.
    /// Returns Ok(false) at end of stream with nothing read.
    pub fn fill(&mut self, buf: &mut Vec<u8>, ends: &mut Vec<usize>, target: usize) -> std::io::Result<bool> {
        buf.clear();
        ends.clear();
        while !self.eof && buf.len() < target {
            let n = self.inner.read_until(b'\n', buf)?;
            if n == 0 {
                self.eof = true;
                break;
            }
            self.bytes_read += n as u64;
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
pub fn parse_line<'a>(line: &'a [u8], key: &str) -> Line<'a> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().all(|b| b.is_ascii_whitespace()) {
        return Line::Blank;
    }
    let mut de = serde_json::Deserializer::from_slice(line);
    let parsed = TextSeed { key }.deserialize(&mut de).and_then(|v| de.end().map(|_| v));
    match parsed {
        Ok(Extracted::Text(t)) => Line::Text(t),
        Ok(Extracted::Missing) => Line::Bad(SkipReason::MissingText, format!("no {key:?} key")),
        Ok(Extracted::NotString(what)) => {
            Line::Bad(SkipReason::TextNotString, format!("{key:?} is {what}, not a string"))
        }
        Ok(Extracted::NotObject(what)) => {
            Line::Bad(SkipReason::NotAnObject, format!("line is a JSON {what}, not an object"))
        }
        Err(e) => {
            let msg = e.to_string();
            if std::str::from_utf8(line).is_err() {
                Line::Bad(SkipReason::InvalidUtf8, format!("invalid UTF-8 ({msg})"))
            } else if msg.contains("surrogate") || msg.contains("hex escape") || msg.contains("invalid unicode code point") {
                Line::Bad(SkipReason::InvalidUtf8, format!("text is not valid Unicode ({msg})"))
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
        assert!(matches!(
            parse_line(b"{\"text\": \"\xff\"}", "text"),
            Line::Bad(SkipReason::InvalidUtf8, _)
        ));
        // Deep nesting is skipped over iteratively: no stack overflow, the text still found.
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(matches!(text(&deep), Line::Bad(SkipReason::NotAnObject, _)));
        let nested = format!(r#"{{"x": {}{}, "text": "ok"}}"#, "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(text(&nested), Line::Text("ok".into()));
    }
}

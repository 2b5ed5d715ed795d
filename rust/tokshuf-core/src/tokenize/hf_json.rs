//! What the fast backend reads of a tokenizer.json, parsed into typed structs (a
//! `serde_json::Value` of GPT-NeoX's file is a B-tree of 50 k entries, slower to build than
//! the tables made from it): the file's structure first, then its vocabulary and merges side
//! by side. And the ids the `tokenizers` crate gives the added tokens, so that a build need
//! not load the crate at all (it is loaded only if the reference is used).

use std::borrow::{Borrow, Cow};
use std::collections::HashSet;
use std::fmt;

use rustc_hash::FxHashMap;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

/// The top level.
#[derive(Deserialize)]
pub struct TokenizerFile<'a> {
    #[serde(default)]
    pub added_tokens: Vec<AddedToken>,
    #[serde(default)]
    pub normalizer: Option<Value>,
    #[serde(default)]
    pub pre_tokenizer: Option<Value>,
    #[serde(borrow, default)]
    pub model: Option<ModelHead<'a>>,
    #[serde(default)]
    pub padding: Option<Value>,
}

/// An entry of `added_tokens`; every field is required, as by the `tokenizers` crate.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct AddedToken {
    pub content: String,
    pub single_word: bool,
    pub lstrip: bool,
    pub rstrip: bool,
    pub normalized: bool,
    pub special: bool,
}

/// A model's settings; its vocabulary and merges stay raw until it is known to be BPE.
#[derive(Deserialize)]
pub struct ModelHead<'a> {
    #[serde(rename = "type", default)]
    pub kind: Option<Value>,
    #[serde(default)]
    pub dropout: Option<Value>,
    #[serde(default)]
    pub continuing_subword_prefix: Option<Value>,
    #[serde(default)]
    pub end_of_word_suffix: Option<Value>,
    #[serde(default)]
    pub ignore_merges: Option<Value>,
    #[serde(borrow, default)]
    pub vocab: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub merges: Option<&'a RawValue>,
}

/// A BPE model's vocabulary and merges, their strings borrowed from the file.
pub struct BpeModel<'a> {
    pub vocab: Vocab<'a>,
    pub merges: Vec<Merge<'a>>,
}

impl<'a> BpeModel<'a> {
    /// Parses the vocabulary and the merges of `head` side by side: they are most of the
    /// file, and most of its load.
    pub fn parse(head: &ModelHead<'a>) -> Result<BpeModel<'a>, String> {
        let (vocab, merges) = (head.vocab.ok_or("BPE model: no vocab")?, head.merges.ok_or("BPE model: no merges")?);
        let (merges, vocab) = super::side_by_side(
            || serde_json::from_str::<Vec<Merge>>(merges.get()).map_err(|e| format!("BPE merges: {e}")),
            || parse_vocab(vocab.get()).map_err(|e| format!("BPE vocab: {e}")),
        );
        Ok(BpeModel { vocab: vocab?, merges: merges? })
    }
}

/// A vocabulary into a map sized up front (growing it as it filled was a tenth of its parse):
/// for as many entries as the text has colons (one after each key), or one per 8 bytes if
/// fewer (a token full of colons must not reserve memory out of proportion to the file).
fn parse_vocab(text: &str) -> serde_json::Result<Vocab<'_>> {
    struct Sized(usize);
    impl<'de> de::DeserializeSeed<'de> for Sized {
        type Value = Vocab<'de>;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Vocab<'de>, D::Error> {
            d.deserialize_map(self)
        }
    }
    impl<'de> Visitor<'de> for Sized {
        type Value = Vocab<'de>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a map of tokens to ids")
        }
        fn visit_map<A: de::MapAccess<'de>>(self, mut entries: A) -> Result<Vocab<'de>, A::Error> {
            let mut vocab = Vocab::with_capacity_and_hasher(self.0, Default::default());
            // A repeated token keeps its last id, as a map deserialized by serde does.
            while let Some((token, id)) = entries.next_entry()? {
                vocab.insert(token, id);
            }
            Ok(vocab)
        }
    }
    let mut d = serde_json::Deserializer::from_str(text);
    let entries = memchr::memchr_iter(b':', text.as_bytes()).count().min(text.len() / 8);
    let vocab = de::DeserializeSeed::deserialize(Sized(entries), &mut d)?;
    d.end()?;
    Ok(vocab)
}

pub type Vocab<'a> = FxHashMap<Text<'a>, u32>;

/// A string of the file, borrowed unless it holds escapes: loading GPT-NeoX's 50 k tokens and
/// 50 k merges then allocates for a few of them rather than 150 k times.
#[derive(PartialEq, Eq, Hash, Debug)]
pub struct Text<'a>(pub Cow<'a, str>);

impl Borrow<str> for Text<'_> {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl std::ops::Deref for Text<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Text<'a>, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(s.to_string())))
            }
        }
        d.deserialize_str(V)
    }
}

/// One merge: `"a b"` (older files) or `["a", "b"]`.
pub struct Merge<'a>(pub Text<'a>, pub Text<'a>);

impl<'de: 'a, 'a> Deserialize<'de> for Merge<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Merge<'a>, D::Error> {
        struct V;
        // A byte loop: merges are a few bytes long, where `str::split` cost more than its
        // search (2% of GPT-NeoX's load).
        fn split<E: de::Error>(s: &str) -> Result<(&str, &str), E> {
            let space = |t: &str| t.bytes().position(|c| c == b' ');
            match space(s) {
                Some(i) if space(&s[i + 1..]).is_none() => Ok((&s[..i], &s[i + 1..])),
                _ => Err(E::custom(format!("merge {s:?} is not two tokens"))),
            }
        }
        impl<'de> Visitor<'de> for V {
            type Value = Merge<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a merge: \"a b\" or [\"a\", \"b\"]")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Merge<'de>, E> {
                let (a, b) = split(s)?;
                Ok(Merge(Text(Cow::Borrowed(a)), Text(Cow::Borrowed(b))))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Merge<'de>, E> {
                let (a, b) = split(s)?;
                Ok(Merge(Text(Cow::Owned(a.to_string())), Text(Cow::Owned(b.to_string()))))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Merge<'de>, A::Error> {
                let a: Text = seq.next_element()?.ok_or_else(|| de::Error::custom("a merge is not two tokens"))?;
                let b: Text = seq.next_element()?.ok_or_else(|| de::Error::custom("a merge is not two tokens"))?;
                if seq.next_element::<de::IgnoredAny>()?.is_some() {
                    return Err(de::Error::custom("a merge is not two tokens"));
                }
                Ok(Merge(a, b))
            }
        }
        d.deserialize_any(V)
    }
}

/// `text` with each `\uXXXX` escape of a non-ASCII character (surrogate halves excepted)
/// written as the character: the same JSON value, whose strings can then be borrowed from
/// the text instead of each being decoded into an allocation of its own (GPT-NeoX's file
/// escapes `Ġ` 72 k times, in most of its tokens and merges). Outside a string such an escape
/// is malformed JSON, and a non-ASCII character there is too, so no text changes validity.
pub fn needless_escapes_written_out(text: &[u8]) -> Cow<'_, [u8]> {
    if memchr::memmem::find(text, b"\\u").is_none() {
        return Cow::Borrowed(text);
    }
    // Two halves side by side (GPT-NeoX's 2.4 MB took 3.5-4.3 ms in one), cut after a newline:
    // no escape holds one, and one that is escaped ends there, so each half is rewritten as
    // the whole text would be.
    let half = text.len() / 2;
    // (Below 64 KiB a thread's start would cost more than it saves.)
    let cut = if text.len() < 1 << 16 { None } else { memchr::memchr(b'\n', &text[half..]).map(|k| half + k + 1) };
    Cow::Owned(match cut {
        Some(cut) => {
            let (head, tail) = text.split_at(cut);
            // The head's buffer has room for the tail: joining them copies it once.
            let (tail, mut head) = super::side_by_side(|| written_out(tail, tail.len()), || written_out(head, text.len()));
            head.extend_from_slice(&tail);
            head
        }
        None => written_out(text, text.len()),
    })
}

fn written_out(text: &[u8], capacity: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(capacity);
    let mut at = 0;
    // Each backslash escapes what follows it (an escaped backslash included, so a pair of
    // them is stepped over whole).
    while let Some(k) = memchr::memchr(b'\\', &text[at..]) {
        let escape = at + k;
        out.extend_from_slice(&text[at..escape]);
        match non_ascii_escape(&text[escape..]) {
            Some(c) => {
                out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
                at = escape + 6;
            }
            None => {
                at = (escape + 2).min(text.len());
                out.extend_from_slice(&text[escape..at]);
            }
        }
    }
    out.extend_from_slice(&text[at..]);
    out
}

/// The character of the escape `\uXXXX` that `escape` starts with, if it is not ASCII.
fn non_ascii_escape(escape: &[u8]) -> Option<char> {
    let hex = escape.strip_prefix(b"\\u")?.get(..4)?;
    let cp = hex.iter().try_fold(0u32, |v, &h| Some(v * 16 + (h as char).to_digit(16)?))?;
    char::from_u32(cp).filter(|c| !c.is_ascii())
}

/// The added tokens by the id the `tokenizers` crate gives each when it loads the file: in
/// file order, a token of the model's vocabulary keeps its id, any other takes the next id
/// from the vocabulary's size on (the `id` written in the file is not used). `None` where
/// the crate's result would hinge on details not modelled here (an empty or repeated
/// content, ids that are not 0..n in the vocabulary, two tokens on one id): the caller
/// then asks the crate.
pub fn added_token_ids(added: Vec<AddedToken>, vocab: &Vocab) -> Option<Vec<(u32, AddedToken)>> {
    let dense = vocab.values().all(|&id| (id as usize) < vocab.len());
    let mut next = u32::try_from(vocab.len()).ok()?;
    let (mut contents, mut ids) = (HashSet::new(), Vec::with_capacity(added.len()));
    for t in &added {
        if t.content.is_empty() || !contents.insert(&t.content) || !dense {
            return None;
        }
        let id = match vocab.get(t.content.as_str()) {
            Some(&id) => id,
            None => {
                next += 1;
                next - 1
            }
        };
        if ids.contains(&id) {
            return None;
        }
        ids.push(id);
    }
    let mut out: Vec<(u32, AddedToken)> = ids.into_iter().zip(added).collect();
    out.sort_by_key(|&(id, _)| id);
    Some(out)
}

/// The added tokens of the crate's `tok` by id, in the form `added_token_ids` gives them. A
/// token is special if the crate treats its content as special: a content listed twice keeps
/// the last entry's flags, but "special" from any entry (the crate's `special_tokens_set`).
pub fn crate_added_tokens(tok: &tokenizers::Tokenizer) -> Vec<(u32, AddedToken)> {
    let vocab = tok.get_added_vocabulary();
    let mut added: Vec<(u32, AddedToken)> = tok
        .get_added_tokens_decoder()
        .into_iter()
        .map(|(id, t)| {
            let tokenizers::AddedToken { content, single_word, lstrip, rstrip, normalized, special } = t;
            let special = special || vocab.is_special_token(&content);
            (id, AddedToken { content, single_word, lstrip, rstrip, normalized, special })
        })
        .collect();
    added.sort_by_key(|(id, _)| *id);
    added
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(content: &str, special: bool) -> AddedToken {
        AddedToken { content: content.into(), single_word: false, lstrip: false, rstrip: false, normalized: !special, special }
    }

    /// The ids equal the `tokenizers` crate's on a file whose added tokens mix vocabulary
    /// tokens, new ones, special and not, in an order other than their declared ids.
    #[test]
    fn added_token_ids_equal_the_crates() {
        let mut vocab: serde_json::Map<String, Value> = serde_json::Map::new();
        for (i, c) in crate::tokenize::hfbpe::byte_level_alphabet().iter().enumerate() {
            vocab.insert(c.to_string(), i.into());
        }
        let added = [token("<b>", true), token("a", false), token("<c>", false), token("!", true), token("<a>", true)];
        let file = serde_json::json!({
            "added_tokens": added.iter().enumerate().map(|(i, t)| serde_json::json!({
                "id": 900 + i, "content": t.content, "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": t.normalized, "special": t.special,
            })).collect::<Vec<_>>(),
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "vocab": vocab, "merges": []},
        });
        let bytes = serde_json::to_vec(&file).unwrap();
        let parsed: TokenizerFile = serde_json::from_slice(&bytes).unwrap();
        let model = BpeModel::parse(&parsed.model.unwrap()).unwrap();
        let ours = added_token_ids(parsed.added_tokens, &model.vocab).unwrap();
        let theirs = crate_added_tokens(&tokenizers::Tokenizer::from_bytes(&bytes).unwrap());
        assert_eq!(ours, theirs);
        assert_eq!(ours.iter().map(|(id, _)| *id).collect::<Vec<_>>(), [33, 97, 256, 257, 258]);
    }

    #[test]
    fn ambiguous_added_tokens_are_left_to_the_crate() {
        let vocab: Vocab = [(Text("a".into()), 0), (Text("b".into()), 1)].into_iter().collect();
        assert!(added_token_ids(vec![token("x", true), token("x", false)], &vocab).is_none());
        assert!(added_token_ids(vec![token("", true)], &vocab).is_none());
        let sparse: Vocab = [(Text("a".into()), 0), (Text("b".into()), 7)].into_iter().collect();
        assert!(added_token_ids(vec![token("x", true)], &sparse).is_none());
        assert!(added_token_ids(vec![token("x", true), token("b", false)], &vocab).is_some());
    }

    /// The same value as the text, and malformed text stays malformed.
    #[test]
    fn needless_escapes_are_written_out() {
        let cases = [
            (r#"{"\u0120t": ["\u0120 \u0120", "\u00e9\u4e2d"]}"#, "{\"\u{120}t\": [\"\u{120} \u{120}\", \"\u{e9}\u{4e2d}\"]}"),
            // ASCII escapes, escaped backslashes before a `u`, and surrogate pairs stay.
            (
                r#"["\u0041\u0022", "\\u0120", "\\\u0120", "\"\u00e9", "\ud83d\ude00"]"#,
                r#"["\u0041\u0022", "\\u0120", "\\Ġ", "\"é", "\ud83d\ude00"]"#,
            ),
            // Malformed escapes are copied; one outside a string turns into another error.
            (r#"["\u012", "\u+123", "\uZZZZ"]"#, r#"["\u012", "\u+123", "\uZZZZ"]"#),
            (r#"["a", \u0120]"#, "[\"a\", \u{120}]"),
            (r#""\u0120\"#, "\"\u{120}\\"),
        ];
        for (text, want) in cases {
            let got = needless_escapes_written_out(text.as_bytes());
            assert_eq!(std::str::from_utf8(&got).unwrap(), want);
            let parse = |t: &[u8]| serde_json::from_slice::<Value>(t).map_err(|_| ());
            assert_eq!(parse(&got), parse(text.as_bytes()), "{text}");
        }
        assert!(matches!(needless_escapes_written_out(br#"{"a": "\n"}"#), Cow::Borrowed(_)));
    }

    /// Texts strung together from JSON's pieces at random, many of them malformed: each
    /// parses as its rewrite does, to the same value or to an error.
    #[test]
    fn rewrites_parse_as_their_texts_do() {
        const PIECES: [&str; 19] = [
            "\"", "\\", "\\\\", "\\u0120", "\\u00E9", "\\u0041", "\\ud83d", "\\ude00", "\\u012", "\\n", "a", "é", " ", ":", ",", "[", "]",
            "{", "}",
        ];
        let (mut seed, mut valid) = (11u64, 0);
        for _ in 0..20_000 {
            seed = crate::hash::mix64(seed);
            let text: String = (0..seed % 12).map(|k| PIECES[(crate::hash::mix64(seed + k) % 19) as usize]).collect();
            let text = format!("[\"{text}\"]");
            let parse = |t: &[u8]| serde_json::from_slice::<Value>(t).ok();
            let (want, got) = (parse(text.as_bytes()), parse(&needless_escapes_written_out(text.as_bytes())));
            assert_eq!(got, want, "{text}");
            valid += usize::from(want.is_some());
        }
        assert!(valid > 1_000, "only {valid} valid texts");
    }

    /// A text cut after any newline is rewritten as the two halves are: what lets a long
    /// file be rewritten in two halves side by side.
    #[test]
    fn halves_cut_after_a_newline_are_rewritten_as_the_whole() {
        const PIECES: [&str; 8] = ["\\", "\\\\", "\\u0120", "\\u01", "u0120", "\n", "a", "\""];
        let mut seed = 3u64;
        for _ in 0..5_000 {
            seed = crate::hash::mix64(seed);
            let text: String = (0..seed % 16).map(|k| PIECES[(crate::hash::mix64(seed + k) % 8) as usize]).collect();
            let whole = written_out(text.as_bytes(), 0);
            for (cut, _) in text.match_indices('\n') {
                let (head, tail) = text.as_bytes().split_at(cut + 1);
                assert_eq!([written_out(head, 0), written_out(tail, 0)].concat(), whole, "{text:?} cut at {}", cut + 1);
            }
        }
        // A long text is rewritten in two halves.
        let long = "\"\\u0120t\\\\\": 1,\n".repeat(10_000);
        assert_eq!(std::str::from_utf8(&needless_escapes_written_out(long.as_bytes())).unwrap(), "\"\u{120}t\\\\\": 1,\n".repeat(10_000));
    }

    #[test]
    fn merges_in_both_forms() {
        let m: Vec<Merge> = serde_json::from_str(r#"["a b", ["c d", "e"], "\" \u0120", ["\\", "f"]]"#).unwrap();
        let texts: Vec<&str> = m.iter().flat_map(|m| [&*m.0, &*m.1]).collect();
        assert_eq!(texts, ["a", "b", "c d", "e", "\"", "\u{120}", "\\", "f"]);
        // Borrowed from the file where nothing is escaped.
        assert!(matches!((&m[0].0 .0, &m[1].1 .0, &m[2].0 .0), (Cow::Borrowed(_), Cow::Borrowed(_), Cow::Owned(_))));
        assert!(serde_json::from_str::<Vec<Merge>>(r#"["a b c"]"#).is_err());
        assert!(serde_json::from_str::<Vec<Merge>>(r#"["ab"]"#).is_err());
        assert!(serde_json::from_str::<Vec<Merge>>(r#"["a  b"]"#).is_err());
        let edges: Vec<Merge> = serde_json::from_str(r#"[" b", "a "]"#).unwrap();
        assert_eq!(edges.iter().flat_map(|m| [&*m.0, &*m.1]).collect::<Vec<_>>(), ["", "b", "a", ""]);
        assert!(serde_json::from_str::<Vec<Merge>>(r#"[["a"]]"#).is_err());
    }
}

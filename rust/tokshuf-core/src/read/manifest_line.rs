//! A fast reader for manifest lines (docs/format.md §2), so that opening a cache of 100,000
//! chunks costs milliseconds: a flat JSON object whose values are plain strings (no escapes)
//! and non-negative integers, which is every line a builder writes. Any other line — escapes,
//! other value types, a repeated key, anything unusual — returns `None` and goes to serde,
//! which then decides exactly as it always did (same values, same errors).

/// `shard`, `num_sequences` and `bytes` of a line, if it has the simple shape.
pub(super) struct Fields<'a> {
    pub shard: &'a [u8],
    pub num_sequences: u64,
    pub bytes: Option<u64>,
}

enum Value<'a> {
    Str(&'a [u8]),
    Int(u64),
}

struct Scan<'a> {
    s: &'a [u8],
    at: usize,
}

impl<'a> Scan<'a> {
    fn ws(&mut self) {
        while matches!(self.s.get(self.at), Some(b' ' | b'\t' | b'\r')) {
            self.at += 1;
        }
    }
    /// The bytes `lit` exactly, no whitespace before them.
    fn lit(&mut self, lit: &[u8]) -> Option<()> {
        self.s[self.at..].starts_with(lit).then(|| self.at += lit.len())
    }
    fn eat(&mut self, b: u8) -> Option<()> {
        self.ws();
        (self.s.get(self.at) == Some(&b)).then(|| self.at += 1)
    }
    /// A string without escapes or control characters.
    fn string(&mut self) -> Option<&'a [u8]> {
        self.eat(b'"')?;
        let start = self.at;
        let len = memchr::memchr2(b'"', b'\\', &self.s[start..])?;
        if self.s[start..start + len].iter().any(|&b| b < 0x20) {
            return None;
        }
        self.at = start + len;
        self.eat(b'"')?;
        Some(&self.s[start..start + len])
    }
    /// A JSON integer that fits u64 (no sign, no leading zero, no fraction or exponent).
    fn int(&mut self) -> Option<u64> {
        let start = self.at;
        let mut v: u64 = 0;
        while let Some(d) = self.s.get(self.at).filter(|b| b.is_ascii_digit()) {
            v = v.checked_mul(10)?.checked_add((d - b'0') as u64)?;
            self.at += 1;
        }
        let len = self.at - start;
        let plain = len == 1 || (len > 1 && self.s[start] != b'0');
        (plain && !matches!(self.s.get(self.at), Some(b'.' | b'e' | b'E'))).then_some(v)
    }
    fn value(&mut self) -> Option<Value<'a>> {
        self.ws();
        match self.s.get(self.at)? {
            b'"' => self.string().map(Value::Str),
            b'0'..=b'9' => self.int().map(Value::Int),
            _ => None,
        }
    }
}

/// The fields of `line` (no newline), or `None` when serde must decide.
pub(super) fn fast_fields(line: &[u8]) -> Option<Fields<'_>> {
    builder_line(line).or_else(|| scanned(line))
}

/// A line exactly as a builder writes it (its keys in order, no spaces, a hex sha256), read by
/// comparing it with that template: opening a cache of 100,000 chunks parses 16 MB of them.
fn builder_line(line: &[u8]) -> Option<Fields<'_>> {
    let mut sc = Scan { s: line, at: 0 };
    sc.lit(br#"{"shard":""#)?;
    let start = sc.at;
    sc.at += line[start..].iter().position(|b| !(b.is_ascii_alphanumeric() || *b == b'_'))?;
    let shard = &line[start..sc.at];
    sc.lit(br#"","num_sequences":"#)?;
    let num_sequences = sc.int()?;
    sc.lit(br#","num_tokens":"#)?;
    sc.int()?;
    sc.lit(br#","bytes":"#)?;
    let bytes = sc.int()?;
    sc.lit(br#","sha256":""#)?;
    let sha = line.get(sc.at..sc.at + 64)?;
    sc.at += 64;
    sc.lit(br#""}"#)?;
    // Not `all`: without its early exit the check compiles to vector compares.
    let hex = sha.iter().fold(true, |ok, b| ok & b.is_ascii_hexdigit());
    (sc.at == line.len() && hex).then_some(Fields { shard, num_sequences, bytes: Some(bytes) })
}

/// Any flat object of strings and integers, keys in any order.
fn scanned(line: &[u8]) -> Option<Fields<'_>> {
    let mut sc = Scan { s: line, at: 0 };
    sc.eat(b'{')?;
    let (mut shard, mut num_sequences, mut bytes) = (None, None, None);
    let mut seen = [false; 5];
    let mut first = true;
    loop {
        if first && sc.eat(b'}').is_some() {
            break;
        }
        first = false;
        let key = sc.string()?;
        sc.eat(b':')?;
        let value = sc.value()?;
        let slot = match key {
            b"shard" => 0,
            b"num_sequences" => 1,
            b"num_tokens" => 2,
            b"bytes" => 3,
            b"sha256" => 4,
            // Unknown keys are ignored, as serde does, whatever their value.
            _ => {
                if sc.eat(b',').is_some() {
                    continue;
                }
                sc.eat(b'}')?;
                break;
            }
        };
        if std::mem::replace(&mut seen[slot], true) {
            return None;
        }
        match (slot, value) {
            (0, Value::Str(s)) => shard = Some(s),
            (1, Value::Int(n)) => num_sequences = Some(n),
            (2, Value::Int(_)) | (4, Value::Str(_)) => {}
            (3, Value::Int(n)) => bytes = Some(n),
            _ => return None,
        }
        if sc.eat(b',').is_some() {
            continue;
        }
        sc.eat(b'}')?;
        break;
    }
    sc.ws();
    if sc.at != line.len() {
        return None;
    }
    Some(Fields { shard: shard?, num_sequences: num_sequences?, bytes })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::ManifestLine;

    const SHA: &str = "8773fd7faba1e9a6e4e4e0d1e4b1ab0e2d6d2f4b6f0c3a0a4a6c53cbd9e0f1a2";

    /// Both fast paths agree with serde wherever they answer; the template answers for every
    /// line a builder writes, and the scanner for any plain flat object.
    #[test]
    fn agrees_with_serde() {
        let built = ManifestLine {
            shard: "shard_00000000".into(),
            num_sequences: 8192,
            num_tokens: Some(16785408),
            bytes: Some(41944064),
            sha256: Some(SHA.into()),
        };
        let built = serde_json::to_string(&built).unwrap();
        let lines: &[&str] = &[
            &built,
            &built.replace(":8192,", ":0,").replace("41944064", "18446744073709551615"),
            &built.replace(":8192,", ":08192,"),
            &built.replace("41944064", "18446744073709551616"),
            &built.replace("41944064", "4194406.4"),
            &built.replace(SHA, &SHA[1..]),
            &built.replace(SHA, &SHA.replace('8', "\\u0038")),
            &built.replace(SHA, &SHA.replacen('8', "\t", 1)),
            &built.replace(SHA, &SHA.replacen('8', "\"", 1)),
            &built.replace("shard_", "shard\\u005f"),
            &built.replace("\"}", "\",\"x\":1}"),
            &built.replace("{", " {"),
            &format!("{built} "),
            r#"{"shard":"shard_00000000","num_sequences":8192,"num_tokens":16785408,"bytes":41944064,"sha256":"8773"}"#,
            r#"{"shard": "shard_00000001", "num_sequences": 4}"#,
            r#" { "num_sequences" : 4 , "shard" : "shard_00000001" , "x": 1 } "#,
            r#"{"shard":"shard_00000001","num_sequences":4,"extra":"a"}"#,
            r#"{"shard":"shard\u0030","num_sequences":4}"#,
            r#"{"shard":"shard_00000001","num_sequences":4,"num_sequences":5}"#,
            r#"{"shard":"shard_00000001","num_sequences":-4}"#,
            r#"{"shard":"shard_00000001","num_sequences":04}"#,
            r#"{"shard":"shard_00000001","num_sequences":4.0}"#,
            r#"{"shard":"shard_00000001","num_sequences":4e0}"#,
            r#"{"shard":"shard_00000001","num_sequences":18446744073709551616}"#,
            r#"{"shard":"shard_00000001","num_sequences":4,"bytes":null}"#,
            r#"{"shard":"shard_00000001","num_sequences":4,"sha256":5}"#,
            r#"{"shard":"shard_00000001","num_sequences":4,"x":{"a":1}}"#,
            r#"{"shard":"shard_00000001"}"#,
            r#"{"shard":"shard_00000001","num_sequences":4,}"#,
            r#"{"shard":"shard_00000001","num_sequences":4} x"#,
            r#"{}"#,
            r#"[1]"#,
        ];
        let mut answered = [0; 3];
        for line in lines {
            let serde: Option<ManifestLine> = serde_json::from_str(line).ok();
            for (k, path) in [builder_line, scanned, fast_fields].into_iter().enumerate() {
                if let Some(f) = path(line.as_bytes()) {
                    answered[k] += 1;
                    let s = serde.as_ref().unwrap_or_else(|| panic!("a fast path accepted what serde rejects: {line}"));
                    assert_eq!((f.shard, f.num_sequences, f.bytes), (s.shard.as_bytes(), s.num_sequences, s.bytes), "{line}");
                }
            }
        }
        assert_eq!(answered, [2, 10, 10], "the builder's lines take the template, the plain lines the scanner");
    }
}

//! Where a file lives: a local path or an object in a store (`s3://`, `gs://`, `az://`), and
//! glob patterns over object keys.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The object stores tokshuf can reach.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scheme {
    S3,
    Gcs,
    Azure,
}

impl Scheme {
    pub fn prefix(self) -> &'static str {
        match self {
            Scheme::S3 => "s3://",
            Scheme::Gcs => "gs://",
            Scheme::Azure => "az://",
        }
    }
}

/// An object (or a key prefix) in a store: `scheme://bucket/key`. `key` has no leading or
/// trailing slash and may be empty (the whole bucket).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RemoteUrl {
    pub scheme: Scheme,
    pub bucket: String,
    pub key: String,
}

impl fmt::Display for RemoteUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}/{}", self.scheme.prefix(), self.bucket, self.key)
    }
}

impl RemoteUrl {
    /// The object `name` under this prefix.
    pub fn join(&self, name: &str) -> RemoteUrl {
        let name = name.trim_start_matches('/');
        let key = if self.key.is_empty() { name.to_string() } else { format!("{}/{name}", self.key) };
        RemoteUrl { scheme: self.scheme, bucket: self.bucket.clone(), key }
    }
    /// The last path segment of the key.
    pub fn file_name(&self) -> &str {
        self.key.rsplit('/').next().unwrap_or("")
    }
}

/// A local path or a remote object.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Location {
    Local(PathBuf),
    Remote(RemoteUrl),
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Local(p) => write!(f, "{}", p.display()),
            Location::Remote(u) => u.fmt(f),
        }
    }
}

impl Location {
    /// Parse a URL (`s3://BUCKET/KEY`, `gs://`, `az://CONTAINER/KEY`, `file://PATH`) or a local
    /// path. Any other `scheme://` is an error rather than a relative path of that name.
    pub fn parse(s: &str) -> Result<Location> {
        if let Some(rest) = s.strip_prefix("file://") {
            return Ok(Location::Local(PathBuf::from(rest)));
        }
        for scheme in [Scheme::S3, Scheme::Gcs, Scheme::Azure] {
            if let Some(rest) = s.strip_prefix(scheme.prefix()) {
                let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
                if bucket.is_empty() {
                    return Err(Error::Config(format!("{s}: the URL names no bucket")));
                }
                let key = key.trim_matches('/');
                if key.split('/').any(|seg| seg.is_empty() || seg == "." || seg == "..") && !key.is_empty() {
                    return Err(Error::Config(format!("{s}: empty, '.' or '..' segments are not allowed in object keys")));
                }
                return Ok(Location::Remote(RemoteUrl { scheme, bucket: bucket.to_string(), key: key.to_string() }));
            }
        }
        if let Some((scheme, _)) = s.split_once("://") {
            if !scheme.is_empty() && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c)) {
                return Err(Error::Config(format!(
                    "{s}: unsupported URL scheme '{scheme}://' (tokshuf reads s3://, gs://, az://, file:// and local paths)"
                )));
            }
        }
        Ok(Location::Local(PathBuf::from(s)))
    }

    /// True for strings that name an object store rather than a local path.
    pub fn is_url(s: &str) -> bool {
        [Scheme::S3, Scheme::Gcs, Scheme::Azure].iter().any(|sc| s.starts_with(sc.prefix()))
    }

    pub fn is_remote(&self) -> bool {
        matches!(self, Location::Remote(_))
    }

    pub fn join(&self, name: &str) -> Location {
        match self {
            Location::Local(p) => Location::Local(p.join(name)),
            Location::Remote(u) => Location::Remote(u.join(name)),
        }
    }

    pub fn as_local(&self) -> Option<&Path> {
        match self {
            Location::Local(p) => Some(p),
            Location::Remote(_) => None,
        }
    }

    /// The name the decoder is chosen by (`.gz`, `.zst`...).
    pub fn file_name(&self) -> String {
        match self {
            Location::Local(p) => p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
            Location::Remote(u) => u.file_name().to_string(),
        }
    }
}

/// True when `s` holds glob syntax.
pub fn has_glob(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// The longest directory prefix of `pattern` free of glob syntax (no trailing slash).
pub fn glob_base(pattern: &str) -> &str {
    let first = pattern.find(['*', '?', '[']).unwrap_or(pattern.len());
    match pattern[..first].rfind('/') {
        Some(i) => &pattern[..i],
        None => "",
    }
}

/// Shell-style matching on `/`-separated keys: `*` and `?` stay within one segment, `**`
/// crosses segments (`a/**/b` also matches `a/b`), `[abc]`, `[a-z]`, `[!x]` classes.
pub fn glob_match(pattern: &str, key: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let s: Vec<char> = key.chars().collect();
    matches_at(&p, &s)
}

fn matches_at(p: &[char], s: &[char]) -> bool {
    match p.first() {
        None => s.is_empty(),
        Some('*') if p.get(1) == Some(&'*') => {
            let rest = &p[2..];
            if rest.first() == Some(&'/') && matches_at(&rest[1..], s) {
                return true;
            }
            (0..=s.len()).any(|i| matches_at(rest, &s[i..]))
        }
        Some('*') => {
            for i in 0..=s.len() {
                if matches_at(&p[1..], &s[i..]) {
                    return true;
                }
                if i < s.len() && s[i] == '/' {
                    break;
                }
            }
            false
        }
        Some('?') => !s.is_empty() && s[0] != '/' && matches_at(&p[1..], &s[1..]),
        Some('[') => match class(&p[1..]) {
            Some((len, negate, items)) => {
                let Some(&c) = s.first() else { return false };
                let hit = items.iter().any(|&(lo, hi)| lo <= c && c <= hi);
                c != '/' && hit != negate && matches_at(&p[1 + len..], &s[1..])
            }
            None => s.first() == Some(&'[') && matches_at(&p[1..], &s[1..]),
        },
        Some(&c) => s.first() == Some(&c) && matches_at(&p[1..], &s[1..]),
    }
}

/// A parsed `[...]` class: chars consumed including `]`, negated, inclusive ranges.
type Class = (usize, bool, Vec<(char, char)>);

/// Parse a character class after its `[`.
fn class(p: &[char]) -> Option<Class> {
    let mut i = 0;
    let negate = matches!(p.first(), Some('!') | Some('^'));
    if negate {
        i += 1;
    }
    let mut items = Vec::new();
    let start = i;
    while i < p.len() {
        if p[i] == ']' && i > start {
            return Some((i + 1, negate, items));
        }
        if i + 2 < p.len() && p[i + 1] == '-' && p[i + 2] != ']' {
            items.push((p[i], p[i + 2]));
            i += 3;
        } else {
            items.push((p[i], p[i]));
            i += 1;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_urls_and_paths() {
        let l = Location::parse("s3://bkt/a/b.jsonl").unwrap();
        assert_eq!(l, Location::Remote(RemoteUrl { scheme: Scheme::S3, bucket: "bkt".into(), key: "a/b.jsonl".into() }));
        assert_eq!(l.to_string(), "s3://bkt/a/b.jsonl");
        assert_eq!(Location::parse("gs://b").unwrap().to_string(), "gs://b/");
        assert_eq!(Location::parse("az://c/x/").unwrap().join("y").to_string(), "az://c/x/y");
        assert_eq!(Location::parse("/tmp/x").unwrap(), Location::Local("/tmp/x".into()));
        assert_eq!(Location::parse("file:///tmp/x").unwrap(), Location::Local("/tmp/x".into()));
        assert!(Location::parse("http://h/x").is_err());
        assert!(Location::parse("s3:///key").is_err());
        assert!(Location::parse("s3://b/a//c").is_err());
        assert!(Location::parse("s3://b/a/../c").is_err());
    }

    #[test]
    fn globs() {
        assert!(glob_match("data/*.jsonl", "data/a.jsonl"));
        assert!(!glob_match("data/*.jsonl", "data/sub/a.jsonl"));
        assert!(glob_match("data/**/*.jsonl", "data/a.jsonl"));
        assert!(glob_match("data/**/*.jsonl", "data/x/y/a.jsonl"));
        assert!(glob_match("data/**", "data/x/y/a.jsonl"));
        assert!(glob_match("d/part-0[0-4].gz", "d/part-03.gz"));
        assert!(!glob_match("d/part-0[0-4].gz", "d/part-05.gz"));
        assert!(glob_match("d/part-0[!0-4].gz", "d/part-05.gz"));
        assert!(glob_match("d/?.gz", "d/a.gz"));
        assert!(!glob_match("d/?.gz", "d/ab.gz"));
        assert!(glob_match("d/[x", "d/[x"));
        assert_eq!(glob_base("data/sub/*.jsonl"), "data/sub");
        assert_eq!(glob_base("*.jsonl"), "");
        assert_eq!(glob_base("a/b[0-9]/c"), "a");
    }
}

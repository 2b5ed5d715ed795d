//! Which characters NFC can change, so that the fast backend normalizes only the texts that
//! hold one. Asking the normalizer about every code point takes about 25 ms, so the table is
//! built only for tokenizers with an NFC normalizer, once per process.

use std::sync::{Arc, OnceLock};

use unicode_normalization_alignments::char::canonical_combining_class;
use unicode_normalization_alignments::{is_nfc_quick, IsNormalized};

/// Code points whose NFC quick check is Yes and whose canonical combining class is 0: such a
/// character never changes under NFC, whatever surrounds it (as decided by the normalizer
/// Hugging Face uses).
pub struct NfcSafe {
    bits: Vec<u64>,
}

impl NfcSafe {
    pub fn shared() -> Arc<NfcSafe> {
        static TABLE: OnceLock<Arc<NfcSafe>> = OnceLock::new();
        TABLE.get_or_init(|| Arc::new(NfcSafe::build())).clone()
    }

    fn build() -> NfcSafe {
        let mut bits = vec![0u64; 0x110000 / 64];
        for c in (0..0x110000u32).filter_map(char::from_u32) {
            if canonical_combining_class(c) == 0 && is_nfc_quick(std::iter::once(c)) == IsNormalized::Yes {
                bits[c as usize / 64] |= 1 << (c as u32 % 64);
            }
        }
        NfcSafe { bits }
    }

    #[inline]
    pub fn contains(&self, cp: u32) -> bool {
        self.bits.get(cp as usize / 64).is_some_and(|w| w >> (cp % 64) & 1 != 0)
    }

    /// All of them, for tests comparing with the reference.
    pub fn members(&self) -> Vec<u32> {
        (0..0x110000u32).filter(|&cp| self.contains(cp)).collect()
    }

    /// Could NFC change `text`? Characters below U+0300 (lead bytes below 0xCC) never do; the
    /// rest are looked up.
    pub fn may_change(&self, text: &str) -> bool {
        let Some(first) = text.bytes().position(|x| x >= 0xCC) else { return false };
        text[first..].chars().any(|c| (c as u32) >= 0x300 && !self.contains(c as u32))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spot_checks() {
        let t = NfcSafe::shared();
        assert!(t.contains('a' as u32) && t.contains(0x4E2D) && !t.contains(0xD800));
        assert!(!t.contains(0x301) && !t.contains(0x212B) && !t.contains(0x1161));
        assert!(!t.may_change("plain text, 中文") && t.may_change("e\u{301}") && t.may_change("\u{212B}"));
    }
}

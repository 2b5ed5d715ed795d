//! Lines as the builder cuts them (LineBatcher: BOM, CRLF, last line without newline), each
//! classified by `parse_line`. Beyond "no panic, no hang": a text that comes out goes back in
//! (as JSON) as the same text, and a blank line is only ASCII whitespace.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokshuf_core::input::{parse_line, Line, LineBatcher};

fuzz_target!(|data: &[u8]| {
    let mut lines = LineBatcher::new(data);
    let (mut buf, mut ends) = (Vec::new(), Vec::new());
    while lines.fill(&mut buf, &mut ends, 256).expect("reading a slice cannot fail") {
        let mut start = 0;
        for &end in &ends {
            let raw = &buf[start..end];
            start = end;
            let raw = raw.strip_suffix(b"\n").unwrap_or(raw);
            match parse_line(raw, "text") {
                Line::Text(t) => {
                    let again = serde_json::to_vec(&serde_json::json!({ "text": &*t })).unwrap();
                    assert_eq!(parse_line(&again, "text"), Line::Text(t.clone()));
                }
                Line::Blank => {
                    assert!(raw.iter().all(|b| b.is_ascii_whitespace()));
                }
                Line::Bad(_, msg) => assert!(!msg.is_empty()),
            }
        }
    }
});

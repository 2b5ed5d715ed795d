//! Encode the text fields of jsonl files on one thread and report MB/s and CPU time: a
//! harness for profiling the tokenizer alone (`perf record target/release/examples/encode_speed`).
//!
//!     cargo run --release --example encode_speed -- SPEC FILE.jsonl [ROUNDS]
use std::io::BufRead;

use tokshuf_core::build::input::{parse_line, Line};
use tokshuf_core::tokenize::{Backend, Tokenizer};

fn cpu_seconds() -> f64 {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
    u.ru_utime.tv_sec as f64 + u.ru_utime.tv_usec as f64 * 1e-6 + u.ru_stime.tv_sec as f64 + u.ru_stime.tv_usec as f64 * 1e-6
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (spec, path) = (&args[1], &args[2]);
    let rounds: usize = args.get(3).map(|s| s.parse().expect("rounds")).unwrap_or(1);
    let texts: Vec<String> = std::io::BufReader::new(std::fs::File::open(path).expect("open"))
        .split(b'\n')
        .filter_map(|l| match parse_line(&l.expect("read"), "text") {
            Line::Text(t) if !t.is_empty() => Some(t.into_owned()),
            _ => None,
        })
        .collect();
    let bytes: usize = texts.iter().map(String::len).sum();
    if std::env::var_os("CHECK").is_some() {
        // Ids against the reference backend, document by document.
        let fast = Tokenizer::load(spec, false, Backend::Fast).expect("tokenizer");
        let reference = Tokenizer::load(spec, false, Backend::Reference).expect("tokenizer");
        let differ = texts.iter().filter(|t| fast.encode(t).expect("encode") != reference.encode(t).expect("encode")).count();
        println!("{differ} of {} documents differ from the reference", texts.len());
    }
    for round in 0..rounds {
        // A fresh tokenizer each round: its memos start cold, as in a build.
        let t0 = std::time::Instant::now();
        let tok = Tokenizer::load(spec, false, Backend::Auto).expect("tokenizer");
        let load = t0.elapsed().as_secs_f64();
        let (c0, t1) = (cpu_seconds(), std::time::Instant::now());
        let mut out = Vec::new();
        let mut ids = 0usize;
        for t in &texts {
            out.clear();
            tok.encoder.encode_into(t, &mut out).expect("encode");
            ids += out.len();
        }
        let (wall, cpu) = (t1.elapsed().as_secs_f64(), cpu_seconds() - c0);
        println!(
            "round {round}: {} {:.1} MB, {ids} ids, load {load:.3} s, encode {wall:.3} s wall {cpu:.3} s cpu = {:.1} MB/s (cpu)",
            tok.backend,
            bytes as f64 / 1e6,
            bytes as f64 / 1e6 / cpu
        );
    }
}

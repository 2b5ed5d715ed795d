//! Encode the text fields of a jsonl file on one thread and report MB/s and CPU time: a
//! harness for profiling the tokenizer alone, memos cold in every round
//! (`perf record target/release/examples/encode_speed SPEC FILE.jsonl`).
//!
//!     cargo run --release --example encode_speed -- SPEC FILE.jsonl [ROUNDS]
//!
//! With `CHECK=1` in the environment it first compares the ids of every document with the
//! reference backend's.
use std::io::BufRead;

use tokshuf_core::build::input::{parse_line, Line};
use tokshuf_core::tokenize::{Backend, Tokenizer};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn thread_cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    secs(u.ru_utime) + secs(u.ru_stime)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, spec, path, rest @ ..] = &args[..] else {
        return Err("usage: encode_speed SPEC FILE.jsonl [ROUNDS]".into());
    };
    let rounds: usize = rest.first().map(|s| s.parse()).transpose()?.unwrap_or(1);
    let mut texts = Vec::new();
    for line in std::io::BufReader::new(std::fs::File::open(path)?).split(b'\n') {
        if let Line::Text(t) = parse_line(&line?, "text") {
            if !t.is_empty() {
                texts.push(t.into_owned());
            }
        }
    }
    let bytes: usize = texts.iter().map(String::len).sum();
    if std::env::var_os("CHECK").is_some() {
        let fast = Tokenizer::load(spec, false, Backend::Fast)?;
        let reference = Tokenizer::load(spec, false, Backend::Reference)?;
        let mut differ = 0;
        for t in &texts {
            differ += (fast.encode(t)? != reference.encode(t)?) as usize;
        }
        println!("{differ} of {} documents differ from the reference", texts.len());
    }
    for round in 0..rounds {
        // A new tokenizer each round: its memos start cold, as in a build.
        let t0 = std::time::Instant::now();
        let tok = Tokenizer::load(spec, false, Backend::Auto)?;
        let load = t0.elapsed().as_secs_f64();
        let (c0, t1) = (thread_cpu_seconds(), std::time::Instant::now());
        let (mut out, mut ids) = (Vec::new(), 0usize);
        for t in &texts {
            out.clear();
            tok.encoder.encode_into(t, &mut out)?;
            ids += out.len();
        }
        let (wall, cpu) = (t1.elapsed().as_secs_f64(), thread_cpu_seconds() - c0);
        println!(
            "round {round}: {} {:.1} MB, {ids} ids, load {load:.3} s, encode {wall:.3} s wall {cpu:.3} s cpu = {:.1} MB/s (cpu)",
            tok.backend,
            bytes as f64 / 1e6,
            bytes as f64 / 1e6 / cpu
        );
    }
    Ok(())
}

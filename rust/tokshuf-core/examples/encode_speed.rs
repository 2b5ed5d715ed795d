//! Encode the text fields of a jsonl file on one thread and report MB/s and CPU time: a
//! harness for profiling the tokenizer alone, memos cold in every round
//! (`perf record target/release/examples/encode_speed SPEC FILE.jsonl`).
//!
//!     cargo run --release --example encode_speed -- SPEC FILE.jsonl [ROUNDS]
//!
//! With `CHECK=1` in the environment it first compares the ids of every document with the
//! reference backend's. With `THREADS=N` the documents are cut into N runs encoded on N
//! threads at once (as a build's threads take files), and CPU time is the process's.
use std::io::BufRead;

use tokshuf_core::build::input::{parse_line, Line};
use tokshuf_core::tokenize::{Backend, Tokenizer};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn cpu_seconds(who: libc::c_int) -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(who, &mut u) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    secs(u.ru_utime) + secs(u.ru_stime)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, spec, path, rest @ ..] = &args[..] else {
        return Err("usage: encode_speed SPEC FILE.jsonl [ROUNDS]".into());
    };
    let rounds: usize = rest.first().map(|s| s.parse()).transpose()?.unwrap_or(1);
    let threads: usize = std::env::var("THREADS").ok().map(|s| s.parse()).transpose()?.unwrap_or(1).max(1);
    let who = if threads > 1 { libc::RUSAGE_SELF } else { libc::RUSAGE_THREAD };
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
        let (c0, t1) = (cpu_seconds(who), std::time::Instant::now());
        let encode = |run: &[String]| -> std::result::Result<usize, String> {
            let (mut out, mut ids) = (Vec::new(), 0usize);
            for t in run {
                out.clear();
                tok.encoder.encode_into(t, &mut out)?;
                ids += out.len();
            }
            Ok(ids)
        };
        let per = texts.len().div_ceil(threads).max(1);
        let counts: Vec<std::result::Result<usize, String>> = if threads == 1 {
            vec![encode(&texts)]
        } else {
            std::thread::scope(|sc| {
                let handles: Vec<_> = texts.chunks(per).map(|run| sc.spawn(move || encode(run))).collect();
                handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".into()))).collect()
            })
        };
        let ids = counts.into_iter().sum::<std::result::Result<usize, String>>()?;
        let (wall, cpu) = (t1.elapsed().as_secs_f64(), cpu_seconds(who) - c0);
        println!(
            "round {round}: {} {:.1} MB, {ids} ids, load {load:.4} s, encode {wall:.3} s wall {cpu:.3} s cpu = {:.1} MB/s (cpu), {:.1} MB/s (wall)",
            tok.backend,
            bytes as f64 / 1e6,
            bytes as f64 / 1e6 / cpu,
            bytes as f64 / 1e6 / wall
        );
    }
    Ok(())
}

"""DCLM's tokshuf-rs command line runs unchanged (docs/tokshuf-rs.md): the literal command of its
README builds the cache the format's model predicts, with the tokenizer from a local Hugging Face
cache; --dclm-compat takes its output conventions; its other flags (--use-tiktoken, --ext,
--threads 0, --s3-retries, --input-json/--output-json) do what their help says."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest
from support import model
from support.cache import metadata, read_chunk, read_contexts
from support.corpus import make_docs, write_jsonl
from support.tokref import NEOX_JSON, neox_reference

# From rust_processing/tokshuf-rs/README.md in mlfoundations/dclm (its comments taken out, as a
# shell would): the command a DCLM user runs.
README_COMMAND = r"""
cargo run --release -- \
--input path/to/raw/dataset \
--local-cell-dir path/to/storage/for/local/cells \
--output path/to/output/location \
--tokenizer "EleutherAI/gpt-neox-20b" \
--seqlen 2049 \
--wds-chunk-size 8192 \
--num-local-cells 512
"""
NEOX_EOT, NEOX_PAD, DCLM_PAD = 0, 1, 50256


def hf_cache(home: Path) -> Path:
    """A Hugging Face cache holding EleutherAI/gpt-neox-20b's tokenizer.json as `hf download`
    lays it out: a blob named by its sha256, a snapshot linking to it, refs/main."""
    repo = home / "hub" / "models--EleutherAI--gpt-neox-20b"
    data = NEOX_JSON.read_bytes()
    blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
    blob.parent.mkdir(parents=True)
    blob.write_bytes(data)
    revision = "4e49eadb5d14bd22f314ec3f45b69a87b88c7691"
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (snapshot / "tokenizer.json").symlink_to(os.path.relpath(blob, snapshot))
    return home


def tokshuf_rs(cwd: Path, command: str, env: Dict[str, str], *extra: str) -> subprocess.CompletedProcess:
    """Run a tokshuf-rs command line with `tokshuf build` in place of `cargo run --release --`."""
    argv = shlex.split(command.replace("\\\n", " "))  # line continuations, as a shell joins them
    assert argv[:4] == ["cargo", "run", "--release", "--"]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TOKSHUF_"))}
    full_env.update(env)
    cmd = [sys.executable, "-m", "tokshuf", "build", *argv[4:], *extra]
    return subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=300)


DOCS = [
    make_docs(30, 1) + ["a literal <|endoftext|> inside a document"],
    make_docs(20, 2),
    make_docs(25, 3),
]


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    raw = tmp_path / "path" / "to" / "raw" / "dataset"
    for name, docs in zip(["a.jsonl", "b.jsonl.gz", "c.jsonl.zst"], DOCS):
        write_jsonl(raw / name, docs)
    hf_cache(tmp_path / "hf")
    return tmp_path


def neox_plain():
    """GPT-NeoX-20B as tokshuf-rs's Hugging Face path encodes: plain `encode`, so special-token
    strings in text become their ids."""
    import tokenizers

    return tokenizers.Tokenizer.from_file(str(NEOX_JSON))


def expected(encode, seqlen: int, tail: str, pad: int, seed: int, cells: int, chunk_size: int) -> List[List[int]]:
    streams, _ = model.model_streams(DOCS, encode, seqlen, tail, None, pad, NEOX_EOT)
    return [c for chunk in model.model_shuffle(streams, seed, cells, chunk_size) for c in chunk]


def test_the_readme_command_builds_the_cache_the_model_predicts(workdir: Path) -> None:
    r = tokshuf_rs(workdir, README_COMMAND, {"HF_HOME": str(workdir / "hf")})
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("tokshuf: path/to/output/location (complete)")
    out = workdir / "path" / "to" / "output" / "location"
    meta = metadata(out)
    assert meta["tokenizer"]["spec"] == "hf:EleutherAI/gpt-neox-20b"
    assert (meta["seqlen"], meta["chunk_size"], meta["num_local_cells"]) == (2049, 8192, 512)
    assert [f["path"] for f in meta["inputs"]] == ["a.jsonl", "b.jsonl.gz", "c.jsonl.zst"]
    encode = lambda text: neox_reference().encode(text, add_special_tokens=False).ids  # noqa: E731
    assert read_contexts(out) == expected(encode, 2049, "stitch", NEOX_PAD, seed=0, cells=512, chunk_size=8192)
    # The scratch folder tokshuf-rs needs is accepted; tokshuf's work folder there is gone.
    assert list((workdir / "path" / "to" / "storage" / "for" / "local" / "cells").iterdir()) == []

    # As DCLM users also run it, with --use-tiktoken: the fast backend, the same ids and bytes.
    r = tokshuf_rs(
        workdir, README_COMMAND.replace("location", "tiktoken"), {"HF_HOME": str(workdir / "hf")}, "--use-tiktoken"
    )
    assert r.returncode == 0, r.stderr
    assert read_contexts(workdir / "path" / "to" / "output" / "tiktoken") == read_contexts(out)
    assert metadata(workdir / "path" / "to" / "output" / "tiktoken")["tokenizer"]["backend"] == "tokshuf-fast"


def test_dclm_compat_takes_tokshuf_rs_conventions(workdir: Path) -> None:
    r = tokshuf_rs(workdir, README_COMMAND, {"HF_HOME": str(workdir / "hf")}, "--dclm-compat", "--threads", "0")
    assert r.returncode == 0, r.stderr
    out = workdir / "path" / "to" / "output" / "location"
    meta = metadata(out)
    assert (meta["format"], meta["seed"], meta["tail"], meta["eot_id"], meta["pad_id"]) == (
        "json.gz",
        1234,
        "pad",
        0,
        DCLM_PAD,
    )
    assert meta["recipe"]["allow_special_tokens"] is True
    with_specials = lambda text: neox_plain().encode(text, add_special_tokens=False).ids  # noqa: E731
    want = expected(with_specials, 2049, "pad", DCLM_PAD, seed=1234, cells=512, chunk_size=8192)
    assert read_contexts(out) == want
    # The literal <|endoftext|> in a document became id 0, as in tokshuf-rs: one more than the documents.
    assert sum(ctx.count(NEOX_EOT) for ctx in want) == sum(len(docs) for docs in DOCS) + 1
    # open_lm's member format: gzipped JSON lists under .json.gz keys.
    first = read_chunk(out / "shard_00000000.tar")
    assert len(first) == meta["num_contexts"] and first[0].tolist() == want[0]


def test_dataset_record_is_rewritten_as_tokshuf_rs_does(workdir: Path) -> None:
    record = {
        "uuid": "2a35aa40-5f25-48b7-b6de-d00b37e1b041",
        "name": "rw_sample",
        "dataset_url": "s3://bucket/raw/rw_sample/",
        "manifest_url": None,
        "sources": [],
        "tokenized": False,
        "tokenizer": None,
        "num_tokens": None,
        "size": None,
        "data_key": "json.gz",
    }
    env = {"HF_HOME": str(workdir / "hf")}

    def rewrite(record_in: str, record_out: str) -> subprocess.CompletedProcess:
        r = tokshuf_rs(
            workdir, README_COMMAND, env, "--dclm-compat", "--input-json", record_in, "--output-json", record_out
        )
        assert r.returncode == 0, r.stderr
        return r

    (workdir / "in.json.gz").write_bytes(gzip.compress(json.dumps(record).encode()))
    r = rewrite("in.json.gz", "out.json")
    assert "tokshuf: warning: the record names no tokenizer" in r.stderr
    out = workdir / "path" / "to" / "output" / "location"
    text = (workdir / "out.json").read_text()
    got = json.loads(text)
    assert list(got) == sorted(got) and text.startswith('{\n  "data_key"')  # serde_json's pretty form
    size = sum(p.stat().st_size for p in out.iterdir())
    assert got == {
        **record,
        "dataset_url": "path/to/output/location/",
        "manifest_url": "path/to/output/location/manifest.jsonl",
        "tokenized": True,
        "tokenizer": "EleutherAI/gpt-neox-20b",
        "num_tokens": metadata(out)["num_contexts"] * 2049,
        "size": size,
    }

    # What the record already says is kept; a token count that differs is reported.
    (workdir / "in2.json").write_text(json.dumps(dict(record, tokenizer="neox", num_tokens=7, size=1)))
    r = rewrite("in2.json", "out2.json")
    assert "num_tokens (7) differs from the cache's" in r.stderr
    got = json.loads((workdir / "out2.json").read_text())
    assert (got["tokenizer"], got["num_tokens"], got["size"]) == ("neox", 7, 1)

    r = tokshuf_rs(workdir, README_COMMAND, env, "--input-json", "in2.json")
    assert r.returncode == 1 and "--input-json and --output-json go together" in r.stderr
    # Refused before the build, not found out after it: an empty name, and an unpacked cache
    # (its num_tokens were counted as contexts x seqlen, its manifest_url named no file).
    for extra, message in (
        (["--output-json", ""], "not a file name in an existing folder"),
        (["--output-json", "o.json", "--packing", "none"], "--packing none makes examples of any length"),
    ):
        r = tokshuf_rs(workdir, README_COMMAND, env, "--input-json", "in2.json", "--overwrite", *extra)
        assert r.returncode == 1 and message in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_model_missing_from_the_hf_cache_says_how_to_fetch_it(workdir: Path) -> None:
    r = tokshuf_rs(workdir, README_COMMAND, {"HF_HOME": str(workdir / "empty")})
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "hf download EleutherAI/gpt-neox-20b tokenizer.json" in r.stderr
    assert r.stderr.count("\n") == 1


def test_ext_chooses_the_files_of_input_folders(workdir: Path) -> None:
    raw = workdir / "path" / "to" / "raw" / "dataset"
    write_jsonl(raw / "d.jsonl.zstd", make_docs(10, 4))
    r = tokshuf_rs(workdir, README_COMMAND, {"HF_HOME": str(workdir / "hf")}, "--ext", "jsonl.zstd")
    assert r.returncode == 0, r.stderr
    assert [f["path"] for f in metadata(workdir / "path/to/output/location")["inputs"]] == ["d.jsonl.zstd"]
    r = tokshuf_rs(workdir, README_COMMAND, {"HF_HOME": str(workdir / "hf")}, "--ext", "parquet", "--overwrite")
    assert r.returncode == 1 and "directory holds no .parquet files" in r.stderr


def test_s3_retries_sets_the_retries_of_each_request(workdir: Path, s3) -> None:
    url = s3.put("raw/a.jsonl", b'{"text": "hello"}\n')
    proxy = s3.faults(every=True, kinds=("slowdown",), match=lambda m, t: m == "GET" and "list-type" not in t)
    counts = []
    for retries in ("1", "3"):
        before = proxy.requests
        # The test store's endpoint, credentials and short timeouts; the retries are the flag's.
        env = {k: v for k, v in os.environ.items() if k.startswith(("AWS_", "TOKSHUF_REMOTE_"))}
        env.pop("TOKSHUF_REMOTE_RETRIES")
        cmd = README_COMMAND.replace("path/to/raw/dataset", url).replace("location", f"r{retries}")
        r = tokshuf_rs(workdir, cmd, {**env, "HF_HOME": str(workdir / "hf")}, "--s3-retries", retries)
        assert r.returncode == 1 and "Traceback" not in r.stderr and url in r.stderr, r.stderr
        counts.append(proxy.requests - before)
    assert counts[1] > counts[0] >= 2


def test_flags_given_win_over_dclm_compat() -> None:
    from tokshuf.__main__ import make_parser
    from tokshuf._cli_build import build_options
    from tokshuf.exceptions import ConfigError

    def options(*flags: str) -> dict:
        return build_options(make_parser().parse_args(["build", "-i", "in", "-o", "out", *flags]))

    keys = ("tokenizer", "seed", "format", "tail", "eot_id", "pad_id", "allow_special_tokens", "bos_id")
    assert [options()[k] for k in keys] == ["tiktoken:r50k_base", 0, "npy", "stitch", None, None, False, None]
    compat = options("--dclm-compat")
    assert [compat[k] for k in keys] == ["EleutherAI/gpt-neox-20b", 1234, "json.gz", "pad", 0, DCLM_PAD, True, None]
    given = options("--dclm-compat", "--seed", "3", "--format", "npy", "--pad-id", "1", "--no-allow-special-tokens")
    assert [given[k] for k in keys] == ["EleutherAI/gpt-neox-20b", 3, "npy", "pad", 0, 1, False, None]
    # Llama 3 through tokshuf-rs's tiktoken path: its padding id and <|begin_of_text|> first.
    llama = options("--dclm-compat", "--tokenizer", "meta-llama/Meta-Llama-3-8B", "--use-tiktoken")
    assert (llama["pad_id"], llama["bos"], llama["bos_id"], llama["tokenizer_backend"]) == (
        128258,
        True,
        128000,
        "fast",
    )
    assert llama["allow_special_tokens"] is False
    # A tokenizer tokshuf-rs does not know keeps tokshuf's special ids.
    other = options("--dclm-compat", "--tokenizer", "tiktoken:cl100k_base")
    assert (other["eot_id"], other["pad_id"], other["allow_special_tokens"]) == (None, None, False)
    assert options("--threads", "0")["threads"] is None
    with pytest.raises(ConfigError, match="contradicts --tokenizer-backend reference"):
        options("--use-tiktoken", "--tokenizer-backend", "reference")

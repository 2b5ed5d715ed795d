"""An unfinished build against other options or changed inputs: a clear error saying what
differs, `overwrite=True` to start over; leftovers of killed runs; `tokshuf status`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tokshuf
from support.build import run_to_pause
from support.cache import assert_same_cache
from support.corpus import parts
from tokshuf.__main__ import main
from tokshuf._cli_status import build_status, format_status

OPTS = dict(seqlen=32, chunk_size=64, threads=2, progress=False)


@pytest.fixture
def corpus(tmp_path):
    return parts(tmp_path / "in", 4, docs=150, step=60, seed=300)


def unfinished(inputs, out, monkeypatch, fail_after: int, **opts) -> None:
    """Leave an unfinished build in `out`: the disk 'fills up' after `fail_after` bytes."""
    monkeypatch.setenv("TOKSHUF_TEST_FAIL_AFTER_BYTES", str(fail_after))
    with pytest.raises(tokshuf.DiskFullError):
        tokshuf.build_cache(inputs, out, **dict(OPTS, **opts))
    monkeypatch.delenv("TOKSHUF_TEST_FAIL_AFTER_BYTES")
    assert json.loads((out / "tokshuf.json").read_text())["status"] != "complete"


def test_other_options_against_unfinished_build_are_refused(corpus, tmp_path, monkeypatch):
    out = tmp_path / "cache"
    unfinished(corpus, out, monkeypatch, 400_000)
    with pytest.raises(tokshuf.OutputExistsError) as e:
        tokshuf.build_cache(corpus, out, **dict(OPTS, seqlen=48, seed=3))
    msg = str(e.value)
    assert "seqlen (32 -> 48)" in msg and "seed (0 -> 3)" in msg and "overwrite" in msg
    with pytest.raises(tokshuf.OutputExistsError, match="inputs"):
        tokshuf.build_cache(corpus[:3], out, **OPTS)
    # Nothing was touched: the original build still resumes.
    tokshuf.build_cache(corpus, out, **OPTS)
    tokshuf.build_cache(corpus, tmp_path / "clean", **OPTS)
    assert_same_cache(out, tmp_path / "clean")


def test_overwrite_starts_over_with_new_options(corpus, tmp_path, monkeypatch):
    out = tmp_path / "cache"
    unfinished(corpus, out, monkeypatch, 1_500_000)
    tokshuf.build_cache(corpus, out, overwrite=True, **dict(OPTS, seqlen=48))
    tokshuf.build_cache(corpus, tmp_path / "clean", **dict(OPTS, seqlen=48))
    assert_same_cache(out, tmp_path / "clean")


def test_overwrite_with_same_options_starts_over(corpus, tmp_path, monkeypatch):
    out = tmp_path / "cache"
    unfinished(corpus, out, monkeypatch, 1_500_000)
    trace = tmp_path / "trace.txt"
    monkeypatch.setenv("TOKSHUF_TEST_TRACE", str(trace))
    tokshuf.build_cache(corpus, out, overwrite=True, **OPTS)
    # Every file tokenized again (and the stitched tails windowed again).
    assert trace.read_text().splitlines().count("stage1.file") == len(corpus) + 1
    trace.write_text("")
    tokshuf.build_cache(corpus, out, **OPTS)  # complete: nothing to do
    assert trace.read_text() == ""
    tokshuf.build_cache(corpus, tmp_path / "clean", **OPTS)
    assert_same_cache(out, tmp_path / "clean")


def test_input_changed_in_place_with_same_size_is_detected(corpus, tmp_path, monkeypatch):
    out = tmp_path / "cache"
    unfinished(corpus, out, monkeypatch, 400_000)
    victim = corpus[2]
    data = victim.read_bytes()
    i = data.index(b"the")
    victim.write_bytes(data[:i] + b"THE" + data[i + 3 :])  # same size, other text
    st = victim.stat()
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
    with pytest.raises(tokshuf.OutputExistsError) as e:
        tokshuf.build_cache(corpus, out, **OPTS)
    assert str(victim) in str(e.value) and "modified" in str(e.value) and "overwrite" in str(e.value)
    tokshuf.build_cache(corpus, out, overwrite=True, **OPTS)
    tokshuf.build_cache(corpus, tmp_path / "clean", **OPTS)
    assert_same_cache(out, tmp_path / "clean")


def test_input_changed_size_is_detected(corpus, tmp_path, monkeypatch):
    out = tmp_path / "cache"
    unfinished(corpus, out, monkeypatch, 400_000)
    with corpus[0].open("a") as f:
        f.write(json.dumps({"text": "one more document"}) + "\n")
    with pytest.raises(tokshuf.OutputExistsError, match=r"inputs \(new or changed: .*part0\.jsonl"):
        tokshuf.build_cache(corpus, out, **OPTS)


def test_complete_cache_with_other_options_is_refused_then_overwritten(corpus, tmp_path):
    out = tmp_path / "cache"
    tokshuf.build_cache(corpus, out, **OPTS)
    with pytest.raises(tokshuf.OutputExistsError, match=r"chunk_size \(64 -> 32\)"):
        tokshuf.build_cache(corpus, out, **dict(OPTS, chunk_size=32))
    tokshuf.build_cache(corpus, out, overwrite=True, **dict(OPTS, chunk_size=32))
    tokshuf.build_cache(corpus, tmp_path / "clean", **dict(OPTS, chunk_size=32))
    assert_same_cache(out, tmp_path / "clean")


@pytest.mark.parametrize(
    "before, after, named",
    [
        (dict(packing="bestfit"), {}, r'packing \("bestfit" -> default\)'),
        ({}, dict(packing="bestfit"), r'packing \(default -> "bestfit"\)'),
        (dict(format="blocks"), {}, r"block_size \(64 -> default\)"),
    ],
)
def test_an_option_set_on_one_side_only_is_named(corpus, tmp_path, before, after, named):
    # A recipe leaves out the fields at their default: either side may lack the key.
    out = tmp_path / "cache"
    tokshuf.build_cache(corpus, out, **dict(OPTS, **before))
    with pytest.raises(tokshuf.OutputExistsError, match=named):
        tokshuf.build_cache(corpus, out, **dict(OPTS, **after))


def test_leftovers_of_a_run_killed_at_its_start_are_cleared(corpus, tmp_path):
    out = tmp_path / "cache"
    (out / ".tokshuf-work").mkdir(parents=True)
    (out / "tokshuf.json.tmp").write_text('{"status": "buil')
    tokshuf.build_cache(corpus, out, **OPTS)
    tokshuf.build_cache(corpus, tmp_path / "clean", **OPTS)
    assert_same_cache(out, tmp_path / "clean")


def test_foreign_files_are_never_removed(corpus, tmp_path):
    out = tmp_path / "cache"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    for overwrite in (False, True):
        with pytest.raises(tokshuf.OutputExistsError, match=r"notes.txt"):
            tokshuf.build_cache(corpus, out, overwrite=overwrite, **OPTS)
    assert (out / "notes.txt").read_text() == "mine"


def test_shards_without_metadata_need_overwrite(corpus, tmp_path):
    out = tmp_path / "cache"
    out.mkdir()
    (out / "shard_00000000.tar").write_bytes(b"\0" * 1024)
    with pytest.raises(tokshuf.OutputExistsError, match=r"no readable tokshuf.json"):
        tokshuf.build_cache(corpus, out, **OPTS)
    tokshuf.build_cache(corpus, out, overwrite=True, **OPTS)
    tokshuf.build_cache(corpus, tmp_path / "clean", **OPTS)
    assert_same_cache(out, tmp_path / "clean")


@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffled", "streaming"])
def test_status_of_unfinished_and_complete_builds(corpus, tmp_path, monkeypatch, capsys, shuffle):
    out = tmp_path / "cache"
    opts = dict(OPTS, shuffle=shuffle)
    # Disk full in stage 1: no chunk plan yet. The budget is below the spills' bytes (about
    # 390 kB): a streaming build also writes chunks during stage 1, as many as its timing
    # allows, so a larger budget could last until the stitched tails are written (and how many
    # chunks it lists by the plan is timing too).
    unfinished(corpus, out, monkeypatch, 150_000 if shuffle else 300_000, shuffle=shuffle)
    s = build_status(out)
    assert (s["status"], s["files_total"]) == ("building" if shuffle else "streaming", 4)
    assert s["files_done"] < 4 and s["chunks_planned"] is None
    if shuffle:
        assert s["files_done"] > 0 and s["chunks_written"] == s["chunks_listed"] == 0
    else:
        # Files are read side by side (none may be finished yet), chunks stream meanwhile
        # (how many by now is a matter of timing; test_streaming.py shows that they do).
        assert s["chunks_listed"] <= s["chunks_written"]

    # Killed in stage 2: every file done, the plan known, some chunks written.
    tokshuf.build_cache(corpus, tmp_path / "clean", **opts)
    clean = json.loads((tmp_path / "clean" / "tokshuf.json").read_text())
    point = "stage2.shard:3" if shuffle else "plan"
    assert run_to_pause(corpus, out, opts, point, tmp_path / "trace.txt") == point
    s = build_status(out)
    assert (s["status"], s["stage"], s["files_done"]) == ("writing", "write", 4)
    assert s["chunks_planned"] == clean["num_chunks"] and s["contexts_planned"] == clean["num_contexts"]
    assert s["chunks_listed"] <= s["chunks_written"] <= s["chunks_planned"]
    if shuffle:
        assert 3 <= s["chunks_written"] < s["chunks_planned"]

    tokshuf.build_cache(corpus, out, **dict(OPTS, shuffle=shuffle))
    s = build_status(out)
    assert (s["status"], s["files_done"]) == ("complete", 4)
    assert s["chunks_written"] == s["chunks_listed"] == s["chunks_planned"] == clean["num_chunks"]
    assert s["work_dir"] is None

    capsys.readouterr()
    assert main(["status", str(out)]) == 0
    text = capsys.readouterr().out
    assert "complete" in text and "4 / 4 tokenized" in text and f"{clean['num_chunks']} planned" in text
    assert main(["status", "--json", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["chunks_written"] == clean["num_chunks"]


def test_status_of_a_folder_named_in_bytes_that_are_not_utf8(corpus, tmp_path):
    # Its name was made valid UTF-8 first (a lossy copy), which named another, empty folder.
    out = os.fsdecode(os.fsencode(str(tmp_path)) + b"/out\xfd")
    tokshuf.build_cache(corpus, out, **OPTS)
    assert (build_status(out)["status"], build_status(out)["files_done"]) == ("complete", 4)


def test_status_cli_on_a_folder_without_a_build(tmp_path):
    r = subprocess.run([sys.executable, "-m", "tokshuf", "status", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 1 and "no tokshuf build" in r.stderr


def test_status_finds_the_work_folder_under_local_cell_dir(corpus, tmp_path, monkeypatch):
    out, cells = tmp_path / "cache", tmp_path / "scratch"
    unfinished(corpus, out, monkeypatch, 150_000, local_cell_dir=cells)
    assert not (out / ".tokshuf-work").exists()
    s = build_status(out)
    assert s["files_done"] == 0  # cannot see the work folder without the hint, and says so
    assert s["work_dir"] is None and s["work_looked"] == str(out / ".tokshuf-work")
    assert "none at" in format_status(s) and "--local-cell-dir" in format_status(s)
    s = build_status(out, local_cell_dir=cells)
    assert 0 < s["files_done"] < 4 and Path(s["work_dir"]).parent == cells
    tokshuf.build_cache(corpus, out, local_cell_dir=cells, **OPTS)
    assert list(cells.iterdir()) == []


@pytest.mark.parametrize("stage", ["tokenizing", "complete"])
def test_resumed_under_local_cell_dir_leaves_no_work_folder_in_the_output(corpus, tmp_path, monkeypatch, stage):
    # The killed run kept its spills in the output; the resumed one keeps its own elsewhere.
    out = tmp_path / "cache"
    if stage == "tokenizing":
        unfinished(corpus, out, monkeypatch, 150_000)
    else:
        tokshuf.build_cache(corpus, out, **OPTS)
        (out / ".tokshuf-work").mkdir()  # as a run killed while cleaning up leaves it
    assert (out / ".tokshuf-work").is_dir()
    tokshuf.build_cache(corpus, out, local_cell_dir=tmp_path / "scratch", **OPTS)
    assert not (out / ".tokshuf-work").exists()
    tokshuf.build_cache(corpus, tmp_path / "clean", **OPTS)
    assert_same_cache(out, tmp_path / "clean")


def test_the_same_build_spelled_otherwise_resumes(corpus, tmp_path, monkeypatch):
    """Inputs named by relative paths, then through a symlinked folder by absolute ones, the
    tokenizer by a relative then an absolute path: one build, resumed where it stopped, with
    the bytes of an uninterrupted one; tokshuf.json names the inputs by their common folder."""
    neox = tmp_path / "neox.json"
    neox.write_bytes((Path(__file__).parent / "data" / "gpt-neox-20b.json").read_bytes())
    monkeypatch.chdir(tmp_path)
    relative = [os.path.relpath(p, tmp_path) for p in corpus]
    assert relative[0] == os.path.join("in", "part0.jsonl")
    stopped = run_to_pause(relative, Path("cache"), dict(OPTS, tokenizer="neox.json"), "stage1.file", tmp_path / "t0")
    assert stopped == "stage1.file"  # killed once the first file was done
    done = build_status(tmp_path / "cache")["files_done"]
    assert done == 1

    (tmp_path / "link").symlink_to(tmp_path / "in")
    linked = [tmp_path / "link" / p.name for p in corpus]
    trace = tmp_path / "trace.txt"
    monkeypatch.setenv("TOKSHUF_TEST_TRACE", str(trace))
    stats = tokshuf.build_cache(linked, tmp_path / "cache", **dict(OPTS, tokenizer=str(neox)))
    # Only the files the first run left, and the stitched tails, were tokenized.
    assert trace.read_text().splitlines().count("stage1.file") == len(corpus)  # 3 files + tails
    assert [f["path"] for f in stats.metadata["inputs"]] == [p.name for p in corpus]
    assert stats.metadata["build"]["input_root"] == str(tmp_path / "link")

    trace.write_text("")
    tokshuf.build_cache([str(p) for p in corpus], tmp_path / "cache", **dict(OPTS, tokenizer=str(neox)))
    assert trace.read_text() == ""  # complete, whatever the spelling: nothing to do
    monkeypatch.delenv("TOKSHUF_TEST_TRACE")
    tokshuf.build_cache(corpus, tmp_path / "clean", **dict(OPTS, tokenizer=str(neox)))
    assert_same_cache(tmp_path / "cache", tmp_path / "clean")

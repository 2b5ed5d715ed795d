"""The command line as a user meets it: one-line errors and exit codes, never a Python traceback
for a user's mistake, a clean exit on a closed pipe, help for every option, --version."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tokshuf
from support.build import build
from support.corpus import three_files


def run(*args: str, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TOKSHUF_DEBUG"}
    env.update(kw.pop("env", {}))
    return subprocess.run(
        [sys.executable, "-m", "tokshuf", *args], capture_output=True, text=True, timeout=300, env=env, **kw
    )


def assert_one_line_error(r: subprocess.CompletedProcess, *fragments: str, code: int = 1) -> None:
    assert r.returncode == code, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    errors = [line for line in r.stderr.splitlines() if ": error:" in line]
    assert len(errors) == 1, r.stderr
    for f in fragments:
        assert f in errors[0], r.stderr


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cli")
    out = root / "cache"
    build(three_files(root / "in"), out, seqlen=32, chunk_size=8)
    return out


def test_version():
    r = run("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"tokshuf {tokshuf.__version__}"


def test_top_level_help_is_plain_text():
    r = run("--help")
    assert r.returncode == 0
    assert "``" not in r.stdout and ":class:" not in r.stdout
    assert "COMMAND --help" in r.stdout


def test_every_option_has_help():
    import argparse

    from tokshuf.__main__ import make_parser

    parser = make_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert {"build", "read", "inspect", "status", "verify", "blend"} <= set(sub.choices)
    for name, p in sub.choices.items():
        for action in p._actions:
            assert action.help, f"{name}: {action.option_strings or action.dest} has no help"


@pytest.mark.parametrize("command", ["read", "inspect"])
def test_closed_pipe_is_a_clean_exit(cache, command):
    extra = ["--batch-size", "2", "--steps", "100000"] if command == "read" else ["-n", "1000"]
    proc = subprocess.Popen(
        f"{sys.executable} -m tokshuf {command} {cache} {' '.join(extra)} | head -2",
        shell=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = proc.communicate(timeout=300)
    assert len(out.splitlines()) == 2
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_negative_steps(cache):
    assert_one_line_error(run("read", str(cache), "--batch-size", "2", "--steps", "-1"), "--steps", "must be in [0,")


@pytest.mark.parametrize("size", ["lots", "infG", "1e400G"])
def test_memory_limit_that_is_not_a_size(tmp_path, size):
    r = run("build", "-i", str(tmp_path), "-o", str(tmp_path / "o"), "--memory-limit", size)
    assert_one_line_error(r, f"'{size}' is not a size", code=2)


@pytest.mark.parametrize(
    "argv",
    [["inspect", "CACHE", "--chars", "-5"], ["blend", "CACHE:1", "--num-examples", "-5"]],
    ids=["inspect-chars", "blend-num-examples"],
)
def test_negative_counts_are_malformed_options(cache, argv):
    r = run(*[str(cache) if a == "CACHE" else a.replace("CACHE", str(cache)) for a in argv])
    assert_one_line_error(r, "'-5' is not a count", code=2)


def test_output_json_where_it_cannot_be_written_is_refused_before_the_build(tmp_path):
    inputs = three_files(tmp_path / "in")
    (tmp_path / "rec.json").write_text('{"name": "x"}')
    for where in (tmp_path / "missing" / "out.json", tmp_path):
        r = run(
            "build", "-i", str(inputs[0]), "-o", str(tmp_path / "o"), "--input-json", str(tmp_path / "rec.json"),
            "--output-json", str(where), "--tokenizer", "tiktoken:r50k_base",
        )  # fmt: skip
        assert_one_line_error(r, "--output-json", "not a file name in an existing folder")
        assert not (tmp_path / "o").exists()


def test_an_empty_output_path_is_refused(tmp_path):
    inputs = three_files(tmp_path / "in")
    (tmp_path / "other.txt").write_text("x")
    assert_one_line_error(run("build", "-i", str(inputs[0]), "-o", "", cwd=tmp_path), "an empty path")
    assert sorted(os.listdir(tmp_path)) == ["in", "other.txt"]


def test_a_full_stdout_is_one_line_not_a_traceback(cache):
    with open("/dev/full", "w") as full:
        r = subprocess.run(
            [sys.executable, "-m", "tokshuf", "read", str(cache), "--batch-size", "2", "--steps", "2"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )
    assert_one_line_error(r, "No space left on device")


def test_verify_quiet_prints_only_the_problems(cache, tmp_path):
    r = run("verify", "--quiet", str(cache))
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    bad = tmp_path / "bad"
    shutil.copytree(cache, bad)
    (bad / "shard_00000000.tar").write_bytes(b"")
    r = run("verify", "--quiet", str(bad))
    assert r.returncode == 1 and r.stdout.splitlines() == tokshuf.verify(bad).problems


def test_output_that_is_a_file(tmp_path):
    inputs = three_files(tmp_path / "in")
    (tmp_path / "file").write_text("x")
    r = run("build", "-i", str(inputs[0]), "-o", str(tmp_path / "file"))
    assert_one_line_error(r, "is not a folder")
    with pytest.raises(tokshuf.OutputExistsError):
        build(inputs, tmp_path / "file")


def test_unknown_tokenizer_lists_the_valid_specs(tmp_path):
    inputs = three_files(tmp_path / "in")
    r = run("build", "-i", str(inputs[0]), "-o", str(tmp_path / "o"), "--tokenizer", "gpt2")
    assert_one_line_error(r, "gpt2: no such tokenizer", "tiktoken:NAME", "r50k_base", "hf:ORG/NAME")
    with pytest.raises(tokshuf.TokenizerError):
        tokshuf.Tokenizer("gpt2")


def test_debug_shows_the_traceback(tmp_path):
    r = run("build", "-i", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "o"), env={"TOKSHUF_DEBUG": "1"})
    assert r.returncode != 0 and "Traceback" in r.stderr and "InputNotFoundError" in r.stderr
    r = run("build", "-i", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "o"), env={"TOKSHUF_DEBUG": "0"})
    assert_one_line_error(r, "missing.jsonl")


def test_a_warning_is_one_line(cache):
    r = run("blend", f"{cache}:1", f"{cache}:2")
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith("tokshuf: warning: blend: ") and len(r.stderr.splitlines()) == 1, r.stderr


def test_build_summary_goes_to_stdout(tmp_path):
    inputs = three_files(tmp_path / "in")
    r = run("build", "-i", str(tmp_path / "in"), "-o", str(tmp_path / "o"), "--seqlen", "32", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("tokshuf: ") and "documents" in r.stdout
    assert r.stderr == ""
    assert len(inputs) == 3


def test_status_of_a_dead_build_says_nothing_is_running(tmp_path):
    from support.build import run_to_pause

    inputs = three_files(tmp_path / "in")
    out = tmp_path / "o"
    opts = dict(seqlen=32, chunk_size=8, threads=1, progress=False)
    assert run_to_pause(inputs, out, opts, "stage1.file", tmp_path / "trace") == "stage1.file"
    r = run("status", str(out))
    assert r.returncode == 0, r.stderr
    assert "not running: run the same build command again" in r.stdout
    assert json.loads(run("status", str(out), "--json").stdout)["running"] is False


def test_state_mismatch_message_quotes_are_balanced(cache, tmp_path):
    other = tmp_path / "other"
    build(three_files(tmp_path / "in"), other, seqlen=32, chunk_size=8, seed=5)
    state = tokshuf.Reader(tokshuf.Cache(cache), batch_size=2).state_dict()
    with pytest.raises(tokshuf.StateMismatchError) as ei:
        tokshuf.Reader(tokshuf.Cache(other), batch_size=2).load_state_dict(state)
    msg = str(ei.value)
    assert msg.count("'") % 2 == 0, msg


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--seqlen", "1", "seqlen must be at least 2"),
        ("--num-local-cells", "0", "num_local_cells must be between 1 and"),
        # It was taken, and the build aborted for want of 800 GB after tokenizing everything.
        ("--num-local-cells", "99999999999", "num_local_cells must be between 1 and"),
    ],
)
def test_options_out_of_range_are_refused_before_any_work(tmp_path, flag, value, message):
    inputs = three_files(tmp_path / "in")
    r = run("build", "-i", str(inputs[0]), "-o", str(tmp_path / "o"), flag, value)
    assert_one_line_error(r, message)
    assert not (tmp_path / "o").exists()


def test_every_command_has_help_in_the_command_list():
    import argparse

    from tokshuf.__main__ import make_parser

    (sub,) = [a for a in make_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    listed = {a.dest: a.help for a in sub._choices_actions}
    assert set(listed) == set(sub.choices)
    assert all(listed.values()), listed


@pytest.mark.parametrize(
    "argv",
    [
        ["build", "-i", "IN", "-o", "OUT", "--seqlen", "1"],
        ["build", "-i", "IN", "-o", "OUT", "--tokenizer", "gpt2"],
        ["build", "-i", "IN", "-o", "FILE"],
        ["read", "CACHE", "--batch-size", "2", "--steps", "-1"],
    ],
    ids=["seqlen-1", "unknown-tokenizer", "output-is-a-file", "negative-steps"],
)
def test_user_mistakes_are_one_line_and_debug_shows_the_traceback(cache, tmp_path, argv):
    inputs = three_files(tmp_path / "in")
    (tmp_path / "file").write_text("x")
    names = {"IN": str(inputs[0]), "OUT": str(tmp_path / "o"), "FILE": str(tmp_path / "file"), "CACHE": str(cache)}
    argv = [names.get(a, a) for a in argv]
    assert_one_line_error(run(*argv))
    r = run(*argv, env={"TOKSHUF_DEBUG": "1"})
    assert r.returncode != 0 and "Traceback" in r.stderr and "tokshuf.exceptions." in r.stderr


def test_rerun_with_absolute_paths_resumes(tmp_path):
    """The issue's case: a build stopped part-way (here by a full disk) and run again with
    absolute instead of relative paths is resumed, not refused as other inputs."""
    three_files(tmp_path / "in")
    relative = ["build", "-i", "in", "-o", "out", "--seqlen", "32", "--chunk-size", "8", "--no-progress"]
    r = run(*relative, cwd=tmp_path, env={"TOKSHUF_TEST_FAIL_AFTER_BYTES": "60000"})
    assert_one_line_error(r, "no space left on device")
    absolute = ["build", "-i", str(tmp_path / "in"), "-o", str(tmp_path / "out")] + relative[5:]
    r = run(*absolute)
    assert r.returncode == 0, r.stderr
    assert run(*absolute[:4], str(tmp_path / "clean"), *absolute[5:]).returncode == 0
    from support.cache import assert_same_cache

    assert_same_cache(tmp_path / "out", tmp_path / "clean")


# --- progress on a terminal ---------------------------------------------------------------

BAR = r"\[[=> ]{30}\]"
RATES = r"\d+\.\d MB/s \| \d+\.\d\d Mtok/s"


def build_on_tty(tmp_path, *extra, **kw):
    from support.terminal import run_on_tty

    sample = Path(__file__).parent / "data" / "sample"
    argv = [sys.executable, "-m", "tokshuf", "build", "-i", str(sample), "-o", str(tmp_path / "out")]
    return run_on_tty([*argv, "--seqlen", "64", "--chunk-size", "64", *extra], width=100, **kw)


def test_progress_leaves_each_stage_in_its_final_state(tmp_path):
    # Slow stages, so the bars are redrawn many times with lines of changing length.
    r = build_on_tty(tmp_path, env={"TOKSHUF_TEST_SLOW": "stage1.file:300,stage2.shard:10"})
    assert r.returncode == 0, r.stderr
    screen = r.screen(100)
    assert len(screen) == 2, screen
    assert re.fullmatch(rf"tokenize {BAR} 3/3 files \| {RATES} \| \d+s", screen[0]), screen[0]
    n = json.loads((tmp_path / "out" / "tokshuf.json").read_text())["num_chunks"]
    assert re.fullmatch(rf"write    {BAR} {n}/{n} chunks \| {RATES} \| \d+s", screen[1]), screen[1]
    assert screen[0].count("=") == 30 and screen[1].count("=") == 30
    assert r.stderr.count(b"\r") > 4  # redrawn in place
    # The summary went to stdout: `build ... > build.log` from a terminal keeps it.
    assert r.stdout.startswith(f"tokshuf: {tmp_path / 'out'} (complete)")


def test_ctrl_c_message_has_a_line_of_its_own(tmp_path):
    r = build_on_tty(
        tmp_path,
        env={"TOKSHUF_TEST_SLOW": "stage1.file:1500"},
        # Two threads finish their first files together: the bar may go from 0/3 straight to
        # 2/3, and the third file still takes 1.5 s.
        interrupt_when=lambda out: re.search(rb" [12]/3 files", out) is not None,
    )
    assert r.returncode == 130
    screen = r.screen(100)
    assert len(screen) == 2, screen
    assert re.fullmatch(rf"tokenize {BAR} [12]/3 files \| {RATES} \| \d+s", screen[0]), screen[0]
    assert screen[1] == "tokshuf: interrupted; run the same command again to resume"
    assert r.stdout == ""


def test_an_interrupted_read_does_not_promise_a_resume(cache):
    p = subprocess.Popen(
        [sys.executable, "-m", "tokshuf", "read", str(cache), "--batch-size", "2", "--steps", "100000000"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(2)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert (p.returncode, err) == (130, "tokshuf: interrupted\n")


def test_nothing_but_the_summary_when_stderr_is_not_a_terminal(tmp_path):
    three_files(tmp_path / "in")
    r = run("build", "-i", str(tmp_path / "in"), "-o", str(tmp_path / "o"), "--seqlen", "32")
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout.startswith("tokshuf: ")


def test_ray_driver_draws_the_same_bars(tmp_path):
    """The Ray engine's driver advances the core's bars (`_core.Progress`) as tasks finish."""
    from support.terminal import run_on_tty

    code = (
        "from tokshuf import _core\n"
        "bar = _core.Progress(True)\n"
        "bar.stage('tokenize', 4, 'files')\n"
        "for _ in range(4): bar.advance(1, 10_000_000, 2_000_000)\n"
        "bar.stage('write', 2, 'chunks')\n"
        "bar.advance(1, 5, 5)\n"
        "bar.end()\n"
        "_core.Progress(False).stage('hidden', 1, 'files')\n"
    )
    r = run_on_tty([sys.executable, "-c", code], width=100)
    assert r.returncode == 0
    screen = r.screen(100)
    assert len(screen) == 2, screen
    assert re.fullmatch(rf"tokenize {BAR} 4/4 files \| {RATES} \| \d+s", screen[0]), screen[0]
    assert re.fullmatch(rf"write    {BAR} 1/2 chunks \| {RATES} \| \d+s", screen[1]), screen[1]


def test_inspect_decodes_only_with_the_tokenizer_the_cache_was_built_with(tmp_path):
    """tokshuf.json names the tokenizer as the build was given it (here a relative path): from
    another folder that path may hold another tokenizer, which decoded wrong text silently."""
    neox = Path(__file__).parent / "data" / "gpt-neox-20b.json"
    a, b = tmp_path / "a", tmp_path / "b"
    (a / "tk").mkdir(parents=True)
    (b / "tk").mkdir(parents=True)
    shutil.copy(neox, a / "tk" / "tok.json")
    swapped = json.loads(neox.read_text())
    vocab = swapped["model"]["vocab"]
    vocab["Ġthe"], vocab["Ġof"] = vocab["Ġof"], vocab["Ġthe"]
    (b / "tk" / "tok.json").write_text(json.dumps(swapped))
    inputs = three_files(tmp_path / "in")
    r = run(
        "build", "-i", str(inputs[0]), "-o", str(tmp_path / "c"), "--tokenizer", "tk/tok.json", "--seqlen", "64", cwd=a
    )
    assert r.returncode == 0, r.stderr

    def inspect(cwd: Path, *extra: str) -> str:
        r = run("inspect", str(tmp_path / "c"), "-n", "1", *extra, cwd=cwd)
        assert r.returncode == 0, r.stderr
        return r.stdout

    right = inspect(a)
    assert "--- context 0" in right and "not decoding" not in right
    assert "not decoding: tk/tok.json is not the tokenizer the cache was built with" in inspect(b)
    assert "cannot load tokenizer" in inspect(tmp_path) and "pass --tokenizer" in inspect(tmp_path)
    assert inspect(tmp_path, "--tokenizer", str(a / "tk" / "tok.json")) == right
    assert "decoding with tk/tok.json, not the tokenizer" in inspect(b, "--tokenizer", "tk/tok.json")

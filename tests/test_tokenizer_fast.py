"""The fast tokenizer backend gives exactly the reference libraries' ids (issue 4).

References: Python ``tiktoken`` ``encode_ordinary`` and Python ``tokenizers``
``encode(text, add_special_tokens=False)`` with ``encode_special_tokens = True``, built offline
by tests/tokref.py. Beyond whole-tokenizer comparisons on real and generated text, the parts
the fast backend derives from the reference engines are checked directly: its character
classes against tiktoken's regex engine and Hugging Face's Oniguruma, and its hand-written
pre-tokenizers against ``tokenizers``' Split on the same patterns.
"""

from __future__ import annotations

import functools
import gzip
import json
import os
import subprocess
import sys

import pytest
import tokenizers
import tokshuf
from hypothesis import given, settings
from hypothesis import strategies as st
from support import tokref
from tokshuf import _core

SAMPLE = tokref.SAMPLE
NEOX = str(tokref.NEOX_JSON)
TIKTOKEN_SPECS = [f"tiktoken:{n}" for n in tokref.TIKTOKEN_NAMES]
ALL_SPECS = [NEOX] + TIKTOKEN_SPECS
FAST = "tokshuf-fast"


def spec_id(spec: str) -> str:
    return "neox" if spec == NEOX else spec.split(":")[1]


@functools.cache
def fast(spec: str, allow_special: bool = False) -> tokshuf.Tokenizer:
    tok = tokshuf.Tokenizer(spec, allow_special_tokens=allow_special, backend="fast")
    assert tok.backend == FAST
    return tok


def sample_texts():
    return list(tokref.sample_texts())


def assert_same(got, expected, texts, what):
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected)):
        if g != e:
            k = next((j for j, (a, b) in enumerate(zip(g, e)) if a != b), min(len(g), len(e)))
            raise AssertionError(
                f"{what}: text {i} {texts[i][:80]!r} differs at id {k}: {g[k : k + 8]} != {e[k : k + 8]}"
            )


# --------------------------------------------------------------------------------------
# Which backend runs.


@pytest.mark.parametrize("spec", ALL_SPECS, ids=spec_id)
def test_auto_picks_fast_and_reference_can_be_forced(spec):
    assert tokshuf.Tokenizer(spec).backend == FAST
    assert tokshuf.Tokenizer(spec, backend="reference").backend == ("hf-tokenizers" if spec == NEOX else "tokshuf-bpe")


def test_unknown_backend_is_a_config_error():
    with pytest.raises(tokshuf.ConfigError, match="tokenizer_backend"):
        tokshuf.Tokenizer("tiktoken:r50k_base", backend="turbo")


def test_build_records_the_backend(tmp_path):
    docs = [t for t in sample_texts()[:20]]
    from support.corpus import write_jsonl

    src = write_jsonl(tmp_path / "in.jsonl", docs)
    ids = {}
    for backend, name in [("auto", FAST), ("fast", FAST), ("reference", "hf-tokenizers")]:
        out = tmp_path / backend
        st_ = tokshuf.build_cache(
            [src], out, tokenizer=NEOX, seqlen=64, progress=False, tokenizer_backend=backend, shuffle=False
        )
        meta = json.loads((out / "tokshuf.json").read_text())
        assert meta["tokenizer"]["backend"] == name
        assert f"[{name}]" in st_.summary()
        ids[backend] = [p.read_bytes() for p in sorted(out.glob("*.tar"))]
    assert ids["auto"] == ids["fast"] == ids["reference"]


# --------------------------------------------------------------------------------------
# Identical ids on real text (test_tokenize.py compares both backends on the whole sample).


@pytest.mark.parametrize("spec", ALL_SPECS, ids=spec_id)
def test_sample_ids_equal_reference_from_warm_memos(spec):
    """Two passes on two threads, then one on one thread: the memos hold what earlier
    documents left in them, and the ids must not depend on it."""
    texts = sample_texts()
    expected = tokref.reference_encode_batch(spec, texts)
    for threads, step in [(2, 1), (2, 2), (1, 3)]:
        assert_same(fast(spec).encode_batch(texts[::step], threads=threads), expected[::step], texts[::step], spec)


# --------------------------------------------------------------------------------------
# Generated text that stresses the edges.

WS = [
    " ",
    "\t",
    "\n",
    "\r",
    "\r\n",
    "\x0b",
    "\x0c",
    "\x1c",
    "\x1f",
    "\x85",
    "\xa0",
    "\u1680",
    "\u2000",
    "\u200a",
    "\u2028",
    "\u2029",
    "\u202f",
    "\u205f",
    "\u3000",
    "\u180e",
    "\u200b",
    "\ufeff",
]
ATOMS = [
    # contractions, any case, and letters that case-fold onto their letters (ſ -> s, K -> k)
    "'s",
    "'S",
    "'t",
    "'T",
    "'re",
    "'RE",
    "'Re",
    "'ve",
    "'VE",
    "'m",
    "'M",
    "'ll",
    "'LL",
    "'lL",
    "'d",
    "'D",
    "'ſ",
    "'İ",
    "'\u212a",
    "’s",
    "''s",
    "'",
    "don't",
    "DON'T",
    "we'VE",
    # NFC changes these (compose, reorder, or decompose an excluded composite)
    "e\u0301",
    "A\u030a",
    "\u212b",
    "\u2126",
    "\u1100\u1161\u11a8",
    "\u0958",
    "a\u0315\u0300\u05ae",
    "\u0344",
    "\u0f73",
    "\U0001d15e",
    "\u0301",
    "\u0345",
    "\U00011382\U000113c9",
    "\U00016d63\U00016d67",
    "\uac00\u11a8",
    # digits of several scripts, numbers
    "0",
    "12",
    "123",
    "1234",
    "٣",
    "१२३",
    "Ⅻ",
    "½",
    "①",
    "𝟘",
    # letters of every kind
    "a",
    "Z",
    "é",
    "ß",
    "ǅ",
    "ʰ",
    "々",
    "中",
    "ア",
    "한",
    "ا",
    "ё",
    "Ωmega",
    "ᾈ",
    "ﬁ",
    "ǈ",
    # marks, emoji, joiners, flags, symbols, punctuation
    "\u0903",
    "\u20dd",
    "😀",
    "👍🏽",
    "👩‍👩‍👧",
    "🇫🇷",
    "\u200d",
    "\U0001fae8",
    "<|endoftext|>",
    "<|padding|>",
    "/",
    "//\n",
    "\\",
    "...",
    "---",
    "!?",
    "$",
    "€",
    "©",
    "\x00",
    "\x7f",
    "_",
    # valid but unusual scalar values: noncharacters, private use, unassigned, plane 16
    "\ufffe",
    "\uffff",
    "\U0001fffe",
    "\ue000",
    "\U000f0000",
    "\U0010fffd",
    "\u0378",
    "\U000e0001",
    "\ud7ff",
]
LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"

atom = st.one_of(
    st.sampled_from(ATOMS),
    st.builds(lambda w, k: w * k, st.sampled_from(WS), st.integers(1, 70)),
    st.text(alphabet=LETTERS, min_size=1, max_size=12),
    st.builds(lambda w: " " + w, st.text(alphabet=LETTERS, min_size=1, max_size=8)),
    st.characters(exclude_categories=["Cs"]),
    st.characters(categories=["Cn", "Co", "Mn", "Mc", "Me", "Lm", "Lo", "Lt", "Nl", "No", "Zs", "Cf"]),
)
nasty_text = st.lists(atom, max_size=30).map("".join)


@given(st.lists(nasty_text, min_size=1, max_size=6))
def test_generated_text_equals_reference(texts):
    for spec in ALL_SPECS:
        assert_same(fast(spec).encode_batch(texts, threads=1), tokref.reference_encode_batch(spec, texts), texts, spec)


@pytest.mark.parametrize("spec", ALL_SPECS, ids=spec_id)
def test_whitespace_runs_of_every_length(spec):
    texts = []
    for k in range(1, 80):
        for w in [" ", "\t", "\n", "\r\n", " \n", "\n ", "\t ", "\u3000", "\xa0", " \u3000"]:
            texts += [w * k, "x" + w * k, w * k + "y", "x" + w * k + "y", "x." + w * k + "'s", "1" + w * k + "!"]
    assert_same(fast(spec).encode_batch(texts), tokref.reference_encode_batch(spec, texts), texts, spec)


@pytest.mark.parametrize("spec", ALL_SPECS, ids=spec_id)
def test_memo_and_merge_boundaries_equal_reference(spec):
    # Past the memo (16 bytes) and the stack merge (64 bytes): the heap merge; past 64 KiB,
    # the compact merge of hostile one-pretoken lines.
    texts = ["a" * n for n in (15, 16, 17, 63, 64, 65, 300, 5000, 70_000)]
    texts += ["abracadabra" * 40, "x" + "-=" * 700, "\u4e2d\u6587" * 300, "😀" * 200, "1234567890" * 50]
    letters = "".join("etaoinshrdlucmfwypvbgkjqxz"[(i * i + 7 * i) % 26] for i in range(70_000))
    texts += [letters, "\xe9" * 34_000, " " * 70_000 + "x"]
    assert_same(fast(spec).encode_batch(texts), tokref.reference_encode_batch(spec, texts), texts, spec)


def test_allow_special_tokens_fast_equals_plain_encode():
    import tokenizers

    plain = tokenizers.Tokenizer.from_file(NEOX)
    texts = [
        "a<|endoftext|>b",
        "<|padding|><|endoftext|>",
        "x  <|endoftext|>  y",
        "<|endoftext",
        "é<|endoftext|>e\u0301",
    ]
    got = fast(NEOX, True).encode_batch(texts)
    assert got == [plain.encode(t, add_special_tokens=False).ids for t in texts]
    assert 0 in got[0]


# --------------------------------------------------------------------------------------
# Character classes: one table (regex-syntax's), equal to what both reference libraries'
# own regex engines say.

ALL_CODE_POINTS = [c for c in range(0x110000) if not 0xD800 <= c < 0xE000]
CLASS_PATTERNS = {
    "L": r"\p{L}",
    "N": r"\p{N}",
    "S": r"\s",
    "UP": r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]",
    "LO": r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]",
}
CLASS_PATTERNS.update({f"fold_{c}": f"(?i:{c})" for c in "stmdlver"})


def tiktoken_members(pattern: str, code_points) -> set:
    """Code points tiktoken's regex engine matches: tiktoken drops what its pattern does not
    match, and with single-byte ranks its ids are the bytes of what it kept."""
    import tiktoken

    enc = tiktoken.Encoding(
        "probe", pat_str=pattern, mergeable_ranks={bytes([i]): i for i in range(256)}, special_tokens={}
    )
    kept = bytes(enc.encode_ordinary("".join(map(chr, code_points)))).decode()
    return {ord(c) for c in kept}


def onig_members(pattern: str, code_points) -> set:
    from tokenizers import Regex, pre_tokenizers

    split = pre_tokenizers.Split(Regex(pattern), behavior="removed", invert=True)
    return {ord(c) for piece, _ in split.pre_tokenize_str("".join(map(chr, code_points))) for c in piece}


def check_classes(engine: str, code_points):
    ours = dict(_core._fast_char_classes())
    members = tiktoken_members if engine == "fancy-regex" else onig_members
    wanted = set(code_points)
    for name, pattern in CLASS_PATTERNS.items():
        got = set(ours[name]) & wanted
        ref = members(pattern, code_points)
        assert got == ref, (
            f"{engine} {name}: only ours {sorted(got - ref)[:10]}, only reference {sorted(ref - got)[:10]}"
        )


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["fancy-regex", "onig"])
def test_character_classes_equal_reference_engines(engine):
    """On every code point (a sample would run in CI beside this and prove nothing more)."""
    check_classes(engine, ALL_CODE_POINTS)


def test_nfc_safe_characters_never_change():
    from tokenizers import normalizers

    nfc = normalizers.NFC()
    safe = dict(_core._fast_char_classes())["NFC_SAFE"]
    text = "".join(map(chr, safe))
    assert nfc.normalize_str(text) == text
    # ...and the ones left out include what NFC does change.
    for s in ["e\u0301", "\u212b", "\u0958", "\u1100\u1161"]:
        assert nfc.normalize_str(s) != s
        assert any(ord(c) not in set(safe) for c in s)


# --------------------------------------------------------------------------------------
# Hand-written pre-tokenizers against Oniguruma running the same patterns in `tokenizers`.

GPT2_HF = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
O200K = "|".join(
    [
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)
HF_PATTERNS = {"gpt2": GPT2_HF, "llama3": LLAMA3, "qwen2": QWEN2, "o200k": O200K}


def onig_split(pattern: str, text: str):
    from tokenizers import Regex, pre_tokenizers

    return [p for p, _ in pre_tokenizers.Split(Regex(pattern), behavior="isolated").pre_tokenize_str(text)]


@given(st.lists(nasty_text, min_size=1, max_size=4))
def test_pretokenizers_equal_oniguruma(texts):
    for name, pattern in HF_PATTERNS.items():
        for t in texts:
            assert _core._fast_pretokenize(pattern, "onig", t) == onig_split(pattern, t), (name, t)


def test_pretokenizers_on_sample_equal_oniguruma():
    texts = sample_texts()[::5]
    for name, pattern in HF_PATTERNS.items():
        for t in texts:
            assert _core._fast_pretokenize(pattern, "onig", t) == onig_split(pattern, t), name


def test_unknown_pattern_is_refused():
    with pytest.raises(ValueError):
        _core._fast_pretokenize(r"\w+|\s+", "onig", "a b")
    # cl100k's `$` means end of line in Oniguruma: its scanner is for tiktoken only.
    cl100k = r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"
    assert _core._fast_pretokenize(cl100k, "fancy-regex", "a \n") == ["a", " \n"]
    with pytest.raises(ValueError):
        _core._fast_pretokenize(cl100k, "onig", "a")


# --------------------------------------------------------------------------------------
# Other tokenizer.json configurations of the family, made from the NeoX file, against
# Python `tokenizers` loading the same file.


def neox_json():
    return json.loads(tokref.NEOX_JSON.read_text(encoding="utf-8"))


def split_then_bytelevel(pattern: str):
    return {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
        ],
    }


def variant(name: str):
    j = neox_json()
    if name == "llama3":  # Llama 3's layout: Split + ByteLevel, no normalizer, ignore_merges
        j["normalizer"] = None
        j["pre_tokenizer"] = split_then_bytelevel(LLAMA3)
        j["model"]["ignore_merges"] = True
    elif name == "qwen2":
        j["pre_tokenizer"] = split_then_bytelevel(QWEN2)
    elif name == "o200k":
        j["pre_tokenizer"] = split_then_bytelevel(O200K)
        j["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFC"}]}
    elif name == "added":  # added tokens of every kind the fast backend accepts
        extra = [
            ("<ctl>", True, False),
            ("<sp>", True, True),
            ("sp>x", False, True),
            ("raw-tok", False, False),
            ("é!", False, True),
            ("<|endoftext|>z", False, False),
        ]
        for k, (content, special, normalized) in enumerate(extra):
            j["added_tokens"].append(
                {
                    "id": 50277 + k,
                    "content": content,
                    "single_word": False,
                    "lstrip": False,
                    "rstrip": False,
                    "normalized": normalized,
                    "special": special,
                }
            )
    elif name == "merges-as-pairs":  # the newer merges format
        j["model"]["merges"] = [m.split(" ") for m in j["model"]["merges"]]
    else:
        raise ValueError(name)
    return j


VARIANT_TEXTS = [
    "<ctl> <sp>x sp>x raw-tok é! e\u0301! <|endoftext|>z <|endoftext|> don'T stop\n\n  now   ok\n \n",
    "Hello WORLD's 12345 ١٢٣٤ 中文 Ωmega\r\n\t x",
    "  <sp>   sp>x<ctl>raw-tokraw-tok",
]


@pytest.fixture(scope="module", params=["llama3", "qwen2", "o200k", "added", "merges-as-pairs"])
def variant_tok(request, tmp_path_factory):
    import tokenizers

    path = tmp_path_factory.mktemp("tok") / f"{request.param}.json"
    path.write_text(json.dumps(variant(request.param)), encoding="utf-8")
    ref = tokenizers.Tokenizer.from_file(str(path))
    plain = tokenizers.Tokenizer.from_file(str(path))
    ref.encode_special_tokens = True
    return str(path), ref, plain


def test_variants_equal_reference(variant_tok):
    path, ref, plain = variant_tok
    texts = VARIANT_TEXTS + sample_texts()[::25]
    expected = [e.ids for e in ref.encode_batch(texts, add_special_tokens=False)]
    assert_same(fast(path).encode_batch(texts), expected, texts, path)
    expected = [e.ids for e in plain.encode_batch(texts, add_special_tokens=False)]
    assert_same(fast(path, True).encode_batch(texts), expected, texts, path + " allow_special")


SAVED_TABLES_SCRIPT = """
import json, sys, tokshuf
t = tokshuf.Tokenizer(sys.argv[1], backend="fast")
print(json.dumps([t.encode_batch(json.load(sys.stdin)), [t.vocab_size, t.eot_id, t.pad_id, t.bos_id, t.sha256]]))
"""


def load_in_fresh_process(path, texts, env):
    """The ids of `texts` and the identity of the tokenizer `path` as a new process loads it."""
    out = subprocess.run(
        [sys.executable, "-c", SAVED_TABLES_SCRIPT, str(path)],
        input=json.dumps(texts),
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def test_variants_from_tables_saved_on_disk_equal_reference(variant_tok, tmp_path):
    """One process saves the fast backend's tables of a tokenizer.json in
    TOKSHUF_TOKENIZER_CACHE, the next loads them instead of parsing the file (it leaves the
    saved file as it is): both encode as the reference and name the same ids."""
    path, ref, _ = variant_tok
    texts = VARIANT_TEXTS + sample_texts()[::50]
    expected = [e.ids for e in ref.encode_batch(texts, add_special_tokens=False)]
    r = tokshuf.Tokenizer(path, backend="reference")
    identity = [r.vocab_size, r.eot_id, r.pad_id, r.bos_id, r.sha256]
    folder = tmp_path / "tables"
    env = {**os.environ, "TOKSHUF_TOKENIZER_CACHE": str(folder)}
    inodes = []
    for run in ("saving", "reading"):
        ids, got_identity = load_in_fresh_process(path, texts, env)
        assert_same(ids, expected, texts, f"{path} ({run} the tables)")
        assert got_identity == identity, run
        (saved,) = folder.iterdir()
        inodes.append(saved.stat().st_ino)
    assert inodes[0] == inodes[1], "the second process saved the tables again rather than reading them"


def test_no_tables_are_saved_where_the_folder_is_empty(tmp_path):
    """TOKSHUF_TOKENIZER_CACHE= (empty) saves nothing; unset, tables go under XDG_CACHE_HOME."""
    env = {
        **os.environ,
        "TOKSHUF_TOKENIZER_CACHE": "",
        "XDG_CACHE_HOME": str(tmp_path / "xdg"),
        "HOME": str(tmp_path / "home"),
    }
    assert load_in_fresh_process(tokref.NEOX_JSON, [], env)[0] == []
    assert not (tmp_path / "xdg").exists() and not (tmp_path / "home").exists()
    env.pop("TOKSHUF_TOKENIZER_CACHE")
    load_in_fresh_process(tokref.NEOX_JSON, [], env)
    assert len(list((tmp_path / "xdg" / "tokshuf" / "tokenizers").iterdir())) == 1


@pytest.mark.parametrize("allow_special", [False, True])
def test_variants_identity_equals_reference(variant_tok, allow_special):
    """The fast backend reads vocabulary size, special ids and added-token ids from the file
    itself (the tokenizers crate is loaded only to decode): they equal the crate's."""
    path, _, plain = variant_tok
    f = tokshuf.Tokenizer(path, backend="fast", allow_special_tokens=allow_special)
    r = tokshuf.Tokenizer(path, backend="reference", allow_special_tokens=allow_special)
    assert (f.vocab_size, f.eot_id, f.pad_id, f.bos_id) == (r.vocab_size, r.eot_id, r.pad_id, r.bos_id)
    assert f.vocab_size == plain.get_vocab_size(with_added_tokens=True)
    text = VARIANT_TEXTS[0]
    assert f.decode(f.encode(text)) == r.decode(r.encode(text))


def test_file_the_tokenizers_crate_refuses(tmp_path):
    """The fast backend reads only what it models, and loads the `tokenizers` crate when it
    first needs it: a file the crate refuses (here for its decoder) still encodes exactly,
    but decoding it raises a TokenizerError instead of returning an empty string."""
    j = neox_json()
    j["decoder"] = {"type": "NoSuchDecoder"}
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(j), encoding="utf-8")
    tok = tokshuf.Tokenizer(str(path), backend="fast")
    text = VARIANT_TEXTS[1]
    assert tok.encode(text) == fast(NEOX).encode(text)
    with pytest.raises(tokshuf.TokenizerError, match=r"not a usable tokenizer\.json"):
        tok.decode(tok.encode(text))
    with pytest.raises(tokshuf.TokenizerError, match=r"not a usable tokenizer\.json"):
        tokshuf.Tokenizer(str(path), backend="reference")


@settings(max_examples=10)
@given(st.lists(nasty_text, min_size=1, max_size=4))
def test_variants_on_generated_text(variant_tok, texts):
    path, ref, _ = variant_tok
    expected = [e.ids for e in ref.encode_batch(texts, add_special_tokens=False)]
    assert_same(fast(path).encode_batch(texts, threads=1), expected, texts, path)


def unsupported(name: str):
    j = neox_json()
    if name == "nfkc":
        j["normalizer"] = {"type": "NFKC"}
    elif name == "prefix-space":
        j["pre_tokenizer"]["add_prefix_space"] = True
    elif name == "other-regex":
        j["pre_tokenizer"] = split_then_bytelevel(r"\w+|\s+|[^\w\s]+")
    elif name == "lstrip":
        j["added_tokens"][2]["lstrip"] = True
    elif name == "wordlevel":
        j["model"] = {"type": "WordLevel", "vocab": {"a": 0, "[UNK]": 1}, "unk_token": "[UNK]"}
        j["added_tokens"] = []
    else:
        raise ValueError(name)
    return j


@pytest.mark.parametrize("name", ["nfkc", "prefix-space", "other-regex", "lstrip", "wordlevel"])
def test_unsupported_configurations_use_the_reference(tmp_path, name):
    path = tmp_path / "tok.json"
    path.write_text(json.dumps(unsupported(name)), encoding="utf-8")
    assert tokshuf.Tokenizer(str(path)).backend == "hf-tokenizers"
    with pytest.raises(tokshuf.ConfigError, match="fast tokenizer backend cannot be used"):
        tokshuf.Tokenizer(str(path), backend="fast")


# --------------------------------------------------------------------------------------
# tokenizer.json files that are legal for the `tokenizers` library but unusual.


def write_json(tmp_path, cfg, name="tok.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(cfg), encoding="utf-8")
    return str(path)


def python_ids(path: str, text: str):
    ref = tokenizers.Tokenizer.from_file(path)
    ref.encode_special_tokens = True
    return ref.encode(text, add_special_tokens=False).ids


def test_ids_that_leave_gaps_size_the_storage_by_the_largest(tmp_path):
    # Ids need not run 0..n-1: the count of tokens (50 k) picked uint16, and a token of id
    # 70000 was stored as 70000 % 65536 without a word.
    cfg = neox_json()
    cfg["model"]["vocab"]["Ġthe"] = 70_000
    path = write_json(tmp_path, cfg)
    text = " the cat and the dog"
    want = python_ids(path, text)
    assert 70_000 in want
    tok = tokshuf.Tokenizer(path)
    assert tok.encode(text) == want and tok.vocab_size == 70_001
    (tmp_path / "in.jsonl").write_text(json.dumps({"text": text}) + "\n")
    stats = tokshuf.build_cache(
        [tmp_path / "in.jsonl"], tmp_path / "c", tokenizer=path, seqlen=8, shuffle=False, tail="pad", progress=False
    )
    assert stats.metadata["dtype"] == "uint32"
    got = [int(i) for i in tokshuf.Cache(tmp_path / "c")[0]]
    assert got[: len(want)] == want
    assert tokshuf.verify(tmp_path / "c", full=True).ok


def test_an_id_of_two_to_the_32_minus_one_is_refused(tmp_path):
    # The encoders' "no id": a token with it was never merged into.
    cfg = neox_json()
    cfg["model"]["vocab"]["t"] = 2**32 - 1
    path = write_json(tmp_path, cfg)
    for backend in ("auto", "fast", "reference"):
        with pytest.raises(tokshuf.TokenizerError, match="4294967295"):
            tokshuf.Tokenizer(path, backend=backend)


def test_a_special_token_listed_again_as_plain_stays_special(tmp_path):
    # The library judges "special" by content, whichever entry said so: the text of an EOT
    # listed twice (special, then not) must still never become the control id.
    cfg = neox_json()
    eot = next(t for t in cfg["added_tokens"] if t["content"] == "<|endoftext|>")
    cfg["added_tokens"].append(dict(eot, special=False))
    path = write_json(tmp_path, cfg)
    text = "a<|endoftext|>b"
    want = python_ids(path, text)
    assert eot["id"] not in want
    for backend in ("auto", "fast", "reference"):
        assert tokshuf.Tokenizer(path, backend=backend).encode(text) == want, backend


def test_bpe_dropout_is_refused_not_random(tmp_path):
    cfg = neox_json()
    cfg["model"]["dropout"] = 0.5
    path = write_json(tmp_path, cfg)
    for backend in ("auto", "fast", "reference"):
        with pytest.raises(tokshuf.TokenizerError, match="dropout"):
            tokshuf.Tokenizer(path, backend=backend)
    cfg["model"]["dropout"] = 0.0  # off: the same ids as none
    assert tokshuf.Tokenizer(write_json(tmp_path, cfg)).encode("the cat") == tokshuf.Tokenizer(NEOX).encode("the cat")


def test_the_padding_section_names_the_pad_id(tmp_path):
    cfg = neox_json()
    cfg["padding"] = {"strategy": "BatchLongest", "direction": "Right", "pad_to_multiple_of": None,
                      "pad_id": 7, "pad_type_id": 0, "pad_token": "("}  # fmt: skip
    path = write_json(tmp_path, cfg)
    for backend in ("auto", "reference"):
        assert tokshuf.Tokenizer(path, backend=backend).pad_id == 7
    assert tokshuf.Tokenizer(NEOX).pad_id == 1  # no section: the token named <|padding|>


def test_a_file_the_library_panics_on_is_a_tokenizer_error(tmp_path):
    # tokenizers 0.22 panics on a merge shorter than the continuing-subword prefix.
    cfg = neox_json()
    cfg["model"]["continuing_subword_prefix"] = "##"
    path = write_json(tmp_path, cfg)
    with pytest.raises(tokshuf.TokenizerError, match=r"not a usable tokenizer\.json"):
        tokshuf.Tokenizer(path)


def test_tokenizer_paths_that_are_not_regular_files(tmp_path):
    import os
    import pathlib

    os.mkfifo(tmp_path / "fifo.json")
    for path in ("/dev/zero", str(tmp_path / "fifo.json")):
        with pytest.raises(tokshuf.TokenizerError, match="not a regular file"):
            tokshuf.Tokenizer(path)
    assert tokshuf.Tokenizer(pathlib.Path(NEOX)).encode("a b") == tokshuf.Tokenizer(NEOX).encode("a b")


@pytest.mark.parametrize("key", ["eot_id", "pad_id", "bos_id"])
def test_booleans_are_not_token_ids(tmp_path, key):
    (tmp_path / "in.jsonl").write_text('{"text": "a"}\n')
    with pytest.raises(tokshuf.ConfigError, match=f"{key} must be a token id, not True"):
        tokshuf.build_cache([tmp_path / "in.jsonl"], tmp_path / "c", progress=False, bos=True, **{key: True})


def test_check_tokenizer_cli(capsys):
    from tokshuf.__main__ import main

    rc = main(["check-tokenizer", "tiktoken:cl100k_base", str(SAMPLE / "kjv.jsonl"), "--limit", "20"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "20 documents" in out and "0 differ" in out and "tiktoken" in out and "MB/s" in out
    rc = main(["check-tokenizer", NEOX, str(SAMPLE), "--limit", "5", "--reference", "tokshuf"])
    assert rc == 0 and "hf-tokenizers (reference backend)" in capsys.readouterr().out


def test_check_tokenizer_cli_reports_differences(monkeypatch, capsys):
    """A reference that differs on some documents: they are counted and the first shown."""
    from tokshuf import _cli_check
    from tokshuf.__main__ import main

    real = _cli_check.python_reference

    def off_by_one(spec, allow_special):
        name, encode = real(spec, allow_special)
        return name, lambda text: [i + 1 for i in encode(text)] if "LORD" in text else encode(text)

    monkeypatch.setattr(_cli_check, "python_reference", off_by_one)
    rc = main(["check-tokenizer", "tiktoken:r50k_base", str(SAMPLE / "kjv.jsonl"), "--limit", "10", "--show", "2"])
    captured = capsys.readouterr()
    assert rc == 1
    lord = sum("LORD" in json.loads(line)["text"] for line in (SAMPLE / "kjv.jsonl").read_text().splitlines()[:10])
    assert lord > 0 and f"{lord} differ" in captured.out
    assert captured.err.count("first difference at id") == min(2, lord)
    assert "kjv.jsonl:" in captured.err


def test_check_tokenizer_cli_unsupported_tokenizer(tmp_path, capsys):
    from tokshuf.__main__ import main

    path = tmp_path / "tok.json"
    path.write_text(json.dumps(unsupported("nfkc")), encoding="utf-8")
    assert main(["check-tokenizer", str(path), str(SAMPLE / "kjv.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tokshuf: error: ") and "normalizer" in err


def test_check_tokenizer_cli_bad_corpora_are_errors_not_a_pass(tmp_path, capsys):
    from tokshuf.__main__ import main

    def error(*argv: str) -> str:
        # 2, as cmp's trouble: 1 says the backends differ.
        assert main(["check-tokenizer", "tiktoken:r50k_base", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("tokshuf: error: ") and len(err.splitlines()) == 1, err
        return err

    # Damaged streams: one line naming the file, as a build gives (it was a traceback).
    (tmp_path / "a.jsonl.gz").write_bytes(b"not gzip at all")
    assert "a.jsonl.gz:1: cannot decompress" in error(str(tmp_path / "a.jsonl.gz"))
    whole = gzip.compress(b'{"text": "a"}\n' * 1000)
    (tmp_path / "t.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    assert "t.jsonl.gz" in error(str(tmp_path / "t.jsonl.gz"))
    # Nothing compared is not "ids identical": a wrong --text-key finds no documents.
    err = error(str(SAMPLE / "kjv.jsonl"), "--text-key", "nope")
    assert "no documents to compare" in err and 'kjv.jsonl:1: no "nope" key' in err
    assert "no such file" in error(str(tmp_path / "missing.jsonl"))


def test_check_tokenizer_cli_gpt2_alias_needs_no_network(capsys):
    # tiktoken's own "gpt2" constructor downloads its files; the reference uses the embedded
    # r50k_base ranks, which are the same.
    from tokshuf.__main__ import main

    assert main(["check-tokenizer", "tiktoken:gpt2", str(SAMPLE / "kjv.jsonl"), "--limit", "5"]) == 0
    assert "5 documents" in capsys.readouterr().out


def test_check_tokenizer_ignores_truncation_and_padding_as_builds_do(tmp_path, capsys):
    from tokshuf.__main__ import main

    cfg = json.loads(tokref.NEOX_JSON.read_text())
    cfg["truncation"] = {"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0}
    cfg["padding"] = {
        "strategy": {"Fixed": 4096},
        "direction": "Right",
        "pad_to_multiple_of": None,
        "pad_id": 1,
        "pad_type_id": 0,
        "pad_token": "<|padding|>",
    }
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(cfg))
    assert main(["check-tokenizer", str(path), str(SAMPLE / "kjv.jsonl"), "--limit", "3", "--reference", "python"]) == 0
    assert "0 differ" in capsys.readouterr().out


def test_check_tokenizer_resolves_specs_as_builds_do(tmp_path, monkeypatch, capsys):
    """A folder and an `hf:` spec reach the Python reference through the builder's resolver."""
    import shutil

    from tokshuf.__main__ import main

    snapshot = tmp_path / "hub" / "models--org--neox" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    shutil.copy(NEOX, snapshot / "tokenizer.json")
    (tmp_path / "hub" / "models--org--neox" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--neox" / "refs" / "main").write_text("abc")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    for spec in [str(snapshot), "hf:org/neox"]:
        assert main(["check-tokenizer", spec, str(SAMPLE / "kjv.jsonl"), "--limit", "3", "--reference", "python"]) == 0
        assert "0 differ" in capsys.readouterr().out

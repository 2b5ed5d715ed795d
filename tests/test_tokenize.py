"""Token ids equal the reference libraries (DESIGN §4), and worst-case input stays linear,
with either tokenizer backend (the fast one that builds use by default, and the reference).

References: Python ``tokenizers`` (GPT-NeoX-20B tokenizer.json, ``encode_special_tokens = True``,
``add_special_tokens=False``) and Python ``tiktoken`` ``encode_ordinary``, both built from the
pinned files under tests/data and the crate's embedded ranks (see tests/tokref.py).
"""

from __future__ import annotations

import functools
import gzip
import hashlib

import pytest
import tokshuf
from hypothesis import given
from hypothesis import strategies as st
from support import tokref

NEOX = str(tokref.NEOX_JSON)
TIKTOKEN_SPECS = [f"tiktoken:{n}" for n in tokref.TIKTOKEN_NAMES]
ALL_SPECS = [NEOX] + TIKTOKEN_SPECS
EOT = {
    NEOX: 0,
    "tiktoken:r50k_base": 50256,
    "tiktoken:p50k_base": 50256,
    "tiktoken:cl100k_base": 100257,
    "tiktoken:o200k_base": 199999,
}


def spec_id(spec: str) -> str:
    return "neox" if spec == NEOX else spec.split(":")[1]


@pytest.fixture(scope="module")
def texts():
    return tokref.sample_texts()


@pytest.fixture(scope="module", params=ALL_SPECS, ids=spec_id)
def spec(request):
    return request.param


@pytest.fixture(scope="module", params=["fast", "reference"])
def backend(request):
    return request.param


REFERENCE_BACKEND = {NEOX: "hf-tokenizers"}


@functools.cache
def ours(spec: str, backend: str) -> tokshuf.Tokenizer:
    tok = tokshuf.Tokenizer(spec, backend=backend)
    assert tok.backend == ("tokshuf-fast" if backend == "fast" else REFERENCE_BACKEND.get(spec, "tokshuf-bpe"))
    return tok


# --------------------------------------------------------------------------------------
# The references themselves are pinned.


@pytest.mark.parametrize("name", ["r50k_base", "cl100k_base", "o200k_base"])
def test_embedded_ranks_match_pinned_hashes(name):
    raw = gzip.decompress((tokref.EMBEDDED / f"{name}.tiktoken.gz").read_bytes())
    digest = hashlib.sha256(raw).hexdigest()
    assert digest == tokref.pinned_sums()[f"{name}.tiktoken"]
    # The hash tokshuf records in tokshuf.json is the same pinned one.
    assert ours(f"tiktoken:{name}", "fast").sha256 == ours(f"tiktoken:{name}", "reference").sha256 == digest


def test_neox_json_is_pinned():
    digest = hashlib.sha256(tokref.NEOX_JSON.read_bytes()).hexdigest()
    assert digest == tokref.pinned_sums()["gpt-neox-20b.json"]
    assert ours(NEOX, "fast").sha256 == ours(NEOX, "reference").sha256 == digest


def test_tokenizer_identity(spec, backend):
    tok = ours(spec, backend)
    assert tok.eot_id == EOT[spec]
    if spec == NEOX:
        assert tok.vocab_size == tokref.neox_reference().get_vocab_size(with_added_tokens=True)
        assert tok.pad_id == 1  # <|padding|>
    else:
        assert tok.vocab_size == tokref.tiktoken_reference(spec.split(":")[1]).n_vocab


# --------------------------------------------------------------------------------------
# Identical ids on real text.


def test_sample_ids_equal_reference(spec, backend, texts):
    assert len(texts) > 200
    expected = tokref.reference_encode_batch(spec, texts)
    got = ours(spec, backend).encode_batch(texts)
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g == e, f"document {i} differs ({texts[i][:60]!r})"


def test_single_encode_equals_batch(spec, backend, texts):
    tok = ours(spec, backend)
    some = texts[::40]
    assert [tok.encode(t) for t in some] == tok.encode_batch(some, threads=1)


TRICKY = [
    "",
    " ",
    "Hello world",
    "  leading and trailing  ",
    "don't I'll we've they're she'd it's DON'T I'LL",
    "tab\tseparated\tvalues\n\nand\r\nwindows\r\nlines\r\n",
    "numbers 1 12 123 1234 12345 3.14159 1,000,000 0x1F",
    "naïve café résumé Æsir Ωmega ǅemal",
    "日本語のテキストと中文文本,한국어 텍스트",
    "emoji 😀👍🏽 family 👨‍👩‍👧 flags 🇫🇷",
    "combining e\u0301 a\u0308 zalgo z\u0336\u0335",
    "Zero\u200bwidth\u200dspaces\ufeffBOM",
    "nbsp\u00a0ideographic\u3000space\u2003em\u2028line\u2029para\x0bvt\x0cff",
    "```python\ndef f(x):\n    return x ** 2  # comment\n```\n",
    '{"json": [1, 2, {"k": null}]}',
    "!!!???...---___===+++***///\\\\\\",
    "a/b/c//d///e\n/\n//\n",
    "\n\n\n\n    \n\t\t\n",
    "x" * 300 + " " + "ab" * 200,
    "\ud7ff\ue000\uffff",  # edges of the BMP that are valid scalar values
]


def test_tricky_strings_equal_reference(spec, backend):
    assert ours(spec, backend).encode_batch(TRICKY) == tokref.reference_encode_batch(spec, TRICKY)


ALPHABET = st.sampled_from(
    list("aAzZ09'’ \t\n\r.,!?/-_()[]{}<>|&$#@%^*~`\"\\")
    + [
        "\u00a0",
        "\u3000",
        "\x0b",
        "é",
        "ß",
        "ǅ",
        "中",
        "ア",
        "한",
        "ا",
        "ё",
        "\u0301",
        "😀",
        "\u200d",
        "<|endoftext|>",
        "<|padding|>",
        "'s",
        "'ll",
        "  ",
        "\r\n",
        "123",
    ]
)


@given(st.lists(st.lists(ALPHABET, max_size=40).map("".join), min_size=1, max_size=8))
def test_random_text_equals_reference(backend, docs):
    for spec in (NEOX, "tiktoken:r50k_base", "tiktoken:cl100k_base", "tiktoken:o200k_base"):
        assert ours(spec, backend).encode_batch(docs) == tokref.reference_encode_batch(spec, docs), spec


@given(st.lists(st.text(alphabet="aeinrstlhoAE", min_size=257, max_size=3000), min_size=1, max_size=4))
def test_long_pieces_equal_reference(backend, words):
    """Long pieces take the heap merge (past 256 bytes in the reference, 64 in the fast backend)."""
    for spec in ("tiktoken:r50k_base", "tiktoken:cl100k_base", "tiktoken:o200k_base"):
        assert ours(spec, backend).encode_batch(words) == tokref.reference_encode_batch(spec, words), spec


# --------------------------------------------------------------------------------------
# Special-token strings in text are ordinary text (DESIGN §4).


def test_literal_endoftext_is_ordinary_text(spec, backend):
    text = "before<|endoftext|>after <|padding|> <|fim_prefix|><|endofprompt|>"
    ids = ours(spec, backend).encode(text)
    assert ids == tokref.reference_encode_batch(spec, [text])[0]
    assert EOT[spec] not in ids
    assert ours(spec, backend).decode(ids) == text


def test_plain_hf_encode_would_inject_control_ids(backend):
    """What the default protects against, and the opt-in that restores plain ``encode``."""
    import tokenizers

    text = "a<|endoftext|>b"
    plain = tokenizers.Tokenizer.from_file(NEOX).encode(text, add_special_tokens=False).ids
    assert 0 in plain  # plain HF turns the string into the control id
    assert 0 not in ours(NEOX, backend).encode(text)
    assert tokshuf.Tokenizer(NEOX, allow_special_tokens=True, backend=backend).encode(text) == plain


def test_lone_surrogate_is_an_input_error(backend):
    # Not Unicode text, so no UTF-8 to tokenize: what a build says of such a line, not a
    # UnicodeEncodeError from the bindings.
    tok = ours("tiktoken:r50k_base", backend)
    with pytest.raises(tokshuf.InputError, match="lone surrogate"):
        tok.encode("a\ud800b")
    with pytest.raises(tokshuf.InputError, match="lone surrogate"):
        tok.encode_batch(["ok", "a\udc00b"])
    assert tok.encode_batch(["a\U0001f600b"]) == [tok.encode("a\U0001f600b")]


def test_allow_special_tokens_is_refused_for_tiktoken():
    with pytest.raises(tokshuf.ConfigError):
        tokshuf.Tokenizer("tiktoken:r50k_base", allow_special_tokens=True)


# --------------------------------------------------------------------------------------
# Long whitespace runs: Python tiktoken panics on runs of a million characters (fancy-regex's
# backtracking stack limit); tokshuf splits long runs itself. Below that the ids must be identical.

WHITESPACE = [" ", "\n", "\t", "\r\n", " \n", "\n ", "\u3000", "\x0b", "\u00a0", " \t\n\r"]
FRAMES = ["x{}y", "{}", "x{}", "!{}y", "{}x", "\n{}x", " {}\n x", "x!{} y", "a{}'s", "{}\n"]


@pytest.mark.parametrize("spec", TIKTOKEN_SPECS, ids=spec_id)
def test_whitespace_runs_equal_reference(spec, backend):
    texts = [
        frame.format(ws * n)
        for ws in WHITESPACE
        for frame in FRAMES
        for n in (1, 2, 3, 62, 63, 64, 65, 66, 129, 1000, 5000)
    ]
    got = ours(spec, backend).encode_batch(texts)
    expected = tokref.reference_encode_batch(spec, texts)
    for text, g, e in zip(texts, got, expected):
        assert g == e, f"{text[:12]!r}... ({len(text)} chars)"


def _million_space_run(spec: str, backend: str):
    """Beyond the reference's limit: compare with its pieces, "x" | n-1 spaces | " y" (every
    pattern splits a run followed by a letter that way), each encoded by tiktoken (the long
    piece with the same ranks and a pattern that keeps it whole)."""
    import tiktoken

    n = 1_100_000
    ref = tokref.tiktoken_reference(spec.split(":")[1])
    whole = tiktoken.Encoding("whole", pat_str=r"[\s\S]+", mergeable_ranks=ref._mergeable_ranks, special_tokens={})
    expected = ref.encode_ordinary("x") + whole.encode_ordinary(" " * (n - 1)) + ref.encode_ordinary(" y")
    assert ours(spec, backend).encode("x" + " " * n + "y") == expected


def test_million_space_run_r50k(backend):
    _million_space_run("tiktoken:r50k_base", backend)


@pytest.mark.slow
@pytest.mark.parametrize("spec", TIKTOKEN_SPECS[1:], ids=spec_id)
def test_million_space_run(spec, backend):
    _million_space_run(spec, backend)


def test_neox_whitespace_runs_equal_reference(backend):
    texts = [frame.format(ws * n) for ws in WHITESPACE for frame in FRAMES for n in (1, 2, 65, 3000)]
    assert ours(NEOX, backend).encode_batch(texts) == tokref.reference_encode_batch(NEOX, texts)

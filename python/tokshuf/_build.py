"""``build_cache``: the Python face of the Rust builder."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Optional, Sequence, Union

from . import _core
from ._inputs import PathLike, expand_inputs, input_suffixes
from ._remote import build_to_url, is_url
from .exceptions import ConfigError

DEFAULT_TOKENIZER = "tiktoken:r50k_base"


@dataclass(frozen=True)
class BuildStats:
    """What a build produced; ``metadata`` is the whole tokshuf.json."""

    output: str
    num_chunks: int
    num_contexts: int
    num_documents: int
    num_tokens: int
    seconds: float
    metadata: Dict[str, Any] = field(repr=False)

    @property
    def mb_per_s(self) -> float:
        return self.metadata.get("text_bytes", 0) / 1e6 / max(self.seconds, 1e-9)

    def summary(self) -> str:
        m = self.metadata
        build = m.get("build", {})
        text_rate = f"{self.mb_per_s:.1f} MB/s of text, " if m.get("text_bytes") else ""
        lines = [
            f"tokshuf: {self.output} ({m['status']})",
            f"  tokenizer   {m['tokenizer']['spec']} [{m['tokenizer']['backend']}], vocab {m['tokenizer']['vocab_size']}, {m['dtype']}",
            f"  documents   {self.num_documents:,} ({m.get('empty_documents', 0):,} empty, {m.get('blank_lines', 0):,} blank lines)",
            f"  tokens      {self.num_tokens:,} in {self.num_contexts:,} contexts of {m['seqlen']} "
            f"({m.get('num_padding_tokens', 0):,} padding, {m.get('dropped_tokens', 0):,} dropped)",
            f"  chunks      {self.num_chunks:,} of {m['chunk_size']} ({m['format']}), {m.get('bytes_out', 0) / 1e6:,.1f} MB",
            f"  time        {self.seconds:.2f} s on {build.get('threads')} threads, "
            f"{text_rate}{self.num_tokens / max(self.seconds, 1e-9) / 1e6:.2f} Mtok/s",
        ]
        if m.get("bins"):  # unpacked: examples of their own lengths, by bin
            lines[3] = (
                f"  tokens      {self.num_tokens:,} in {self.num_contexts:,} examples of 1..{m['seqlen']} ids, "
                f"in {len(m['bins'])} length bins (no padding)"
            )
        if m.get("recipe", {}).get("input_kind") == "shards":
            n = len(m.get("inputs", []))
            lines.insert(1, f"  inputs      {n:,} tar shard{'s' * (n != 1)}, their contexts shuffled again")
        pack = m.get("packing_stats")
        if pack:
            lines.append(
                f"  packing     {pack['mode']}: {pack['padding_fraction']:.2%} padding, {pack['documents_split']:,} "
                f"documents split (concat would split {pack['concat_documents_split']:,})"
            )
        for stage, secs in build.get("durations", {}).items():
            lines.append(f"    {stage:<12}{secs:.2f}")
        if build.get("peak_rss_bytes"):
            lines.append(f"  peak RSS    {build['peak_rss_bytes'] / 2**20:,.0f} MiB")
        for reason, n in m.get("skipped", {}).items():
            lines.append(f"  skipped     {n:,} lines: {reason}")
            for ex in m.get("skipped_examples", {}).get(reason, [])[:3]:
                lines.append(f"                {ex}")
        return "\n".join(lines)


def build_cache(
    inputs: Union[PathLike, Iterable[PathLike]],
    output: PathLike,
    *,
    tokenizer: str = DEFAULT_TOKENIZER,
    seqlen: int = 2049,
    chunk_size: int = 8192,
    num_local_cells: Optional[int] = None,
    local_cell_dir: Optional[PathLike] = None,
    seed: int = 0,
    threads: Optional[int] = None,
    text_key: str = "text",
    format: str = "npy",
    tail: str = "stitch",
    eot_id: Optional[int] = None,
    pad_id: Optional[int] = None,
    bos: bool = False,
    bos_id: Optional[int] = None,
    allow_special_tokens: bool = False,
    shuffle: bool = True,
    memory_limit: Optional[int] = None,
    errors: str = "raise",
    progress: bool = True,
    overwrite: bool = False,
    tokenizer_backend: str = "auto",
    packing: str = "concat",
    pack_window: Optional[int] = None,
    bins: Optional[Sequence[int]] = None,
    bin_size: Optional[int] = None,
    block_size: Optional[int] = None,
    engine: str = "local",
    ray_address: Optional[str] = None,
    shuffle_only: bool = False,
) -> BuildStats:
    """Tokenize jsonl corpora into a shuffled WebDataset cache (see README and docs/format.md).

    Running the same call again resumes an interrupted build (killed, out of disk space...) to
    the same bytes, or returns at once if the cache is complete. Other options or changed input
    files against an existing build raise ``OutputExistsError`` saying what differs;
    ``overwrite=True`` discards the existing build and starts over. ``threads``,
    ``memory_limit``, ``local_cell_dir`` and ``progress`` never change the output; every other
    argument does. With ``shuffle=False`` the build streams: chunks are written (and listed in
    manifest.jsonl) while the input files are still being tokenized. ``tokenizer_backend``: ``"auto"`` (the
    fast backend where it is exact for this tokenizer, else the reference), ``"fast"``
    (an error where it cannot be used) or ``"reference"``; the ids are the same.
    ``packing``: ``"concat"`` (documents run together, cut every ``seqlen`` ids) or
    ``"bestfit"`` (documents placed whole into padded contexts by best-fit decreasing over
    windows of ``pack_window`` documents, default 1024; only documents longer than ``seqlen``
    are split; ``tail`` does not apply) or ``"none"`` (every document, cut at ``seqlen``, is an
    example of its own length, stored by length bin in sub-caches ``bin_KK/``: ``bins`` lists the
    bins' upper bounds, the last being ``seqlen``, or ``bin_size`` gives equal-width bins,
    default ``ceil(seqlen / 16)``; docs/format.md §4.2). ``format``: ``"npy"`` (one context per
    tar member, default), ``"json.gz"`` (what open_lm reads), ``"blocks"`` (2-D npy arrays of
    ``block_size`` contexts, default 64: about 2.01 bytes per uint16 id) or ``"blocks.zst"``
    (those arrays zstd-compressed); docs/format.md §3. ``output`` may be an object-store URL
    (``s3://BUCKET/PREFIX``...; docs/storage.md).

    ``engine="ray"`` runs the build as tasks on a Ray cluster (``pip install "tokshuf[ray]"``;
    docs/distributed.md): ``ray_address`` ``"auto"`` (default) joins the running cluster, else
    starts a local one; ``threads`` is then the CPUs (and threads) of each task. The cache is
    byte-identical to ``engine="local"``'s but for tokshuf.json's ``build``.

    ``shuffle_only=True`` takes tar shards of contexts (a tokshuf cache's, or tokshuf-rs's) as
    inputs instead of jsonl: each ``.npy`` or ``.json.gz`` member is one context, shuffled
    again exactly as a build shuffles (directories are searched for ``.tar`` files).
    ``tokenizer`` and ``seqlen`` must be those the shards were made with; nothing that shapes
    contexts from documents (``tail``, ``packing``, ``bos``, ``text_key``) applies.
    """
    stats = run_build(**locals())
    if progress and sys.stderr.isatty():
        print(stats.summary(), file=sys.stderr)
    return stats


def run_build(inputs: Union[PathLike, Iterable[PathLike]], output: PathLike, **options: Any) -> BuildStats:
    """``build_cache`` without printing its summary (the CLI prints it on stdout). The core
    checks every option. ``ext`` (the CLI's): the file names directories are searched for."""
    if is_url(output):
        local, overwrite = options.pop("local_cell_dir", None), options.pop("overwrite", False)
        return build_to_url(run_build, inputs, output, local, overwrite, **options)
    suffixes = input_suffixes(options.pop("ext", None), bool(options.get("shuffle_only")))
    engine, ray_address = options.pop("engine", "local"), options.pop("ray_address", None)
    if engine not in ("local", "ray"):
        raise ConfigError(f"engine must be 'local' or 'ray', not {engine!r}")
    if ray_address is not None and engine != "ray":
        raise ConfigError("ray_address is an option of engine='ray'")
    local = options.get("local_cell_dir")
    options.update(
        # Absolute: the core records them relative to their common folder anyway, and tasks of
        # the Ray engine run in other working folders.
        inputs=[p if is_url(p) else os.path.abspath(p) for p in expand_inputs(inputs, suffixes)],
        output=os.fspath(output),
        local_cell_dir=None if local is None else os.fspath(local),
    )
    if engine == "ray":
        from . import _ray

        ray_opts = _ray.RayOptions(address=ray_address or "auto", cpus_per_task=options.get("threads"))
        meta = _ray.build(options, ray_opts, options.get("progress", True))
    else:
        meta = json.loads(_core.build_cache(**options))
    return BuildStats(
        output=os.fspath(output),
        num_chunks=meta["num_chunks"],
        num_contexts=meta["num_contexts"],
        num_documents=meta["num_documents"],
        num_tokens=meta["num_tokens"],
        seconds=meta["build"]["total_s"],
        metadata=meta,
    )

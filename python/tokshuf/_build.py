"""``build_cache``: the Python face of the Rust builder."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Literal, Optional, Sequence, Union

from . import _core
from ._inputs import PathLike, expand_inputs, input_suffixes, location
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
    format: Literal["npy", "json.gz", "blocks", "blocks.zst"] = "npy",
    tail: Literal["stitch", "pad", "drop"] = "stitch",
    eot_id: Optional[int] = None,
    pad_id: Optional[int] = None,
    bos: bool = False,
    bos_id: Optional[int] = None,
    allow_special_tokens: bool = False,
    shuffle: bool = True,
    memory_limit: Optional[int] = None,
    errors: Literal["raise", "skip"] = "raise",
    progress: bool = True,
    overwrite: bool = False,
    tokenizer_backend: Literal["auto", "fast", "reference"] = "auto",
    packing: Literal["concat", "bestfit", "none"] = "concat",
    pack_window: Optional[int] = None,
    bins: Optional[Sequence[int]] = None,
    bin_size: Optional[int] = None,
    block_size: Optional[int] = None,
    engine: Literal["local", "ray"] = "local",
    ray_address: Optional[str] = None,
    shuffle_only: bool = False,
) -> BuildStats:
    """Tokenize jsonl corpora into a shuffled WebDataset cache (docs/building.md; the format is
    docs/format.md).

    Running the same call again resumes an interrupted build (killed, out of disk space...) to
    the same bytes, or returns at once if the cache is complete. Other options or changed input
    files against an existing build raise :class:`tokshuf.OutputExistsError` saying what
    differs. ``threads``, ``memory_limit``, ``local_cell_dir``, ``progress``, ``overwrite``,
    ``engine`` and ``ray_address`` never change the output; every other argument does.

    Args:
        inputs: ``.jsonl``, ``.jsonl.gz``, ``.jsonl.zst`` or ``.jsonl.zstd`` files, directories
            (searched recursively), globs or object-store URLs, one or several. Files are read in
            sorted order, each once.
        output: the cache folder (or ``s3://BUCKET/PREFIX``...; docs/storage.md: the local engine
            builds it on local disk and uploads it, the Ray engine's tasks upload their files as
            they go). It must be new or empty, or hold an unfinished build of the same inputs and
            options.
        tokenizer: ``"tiktoken:r50k_base"`` (default), ``"tiktoken:p50k_base"``,
            ``"tiktoken:cl100k_base"``, ``"tiktoken:o200k_base"`` (embedded), a Hugging Face
            ``tokenizer.json`` or a folder holding one, or ``"hf:ORG/NAME"`` from the local
            Hugging Face cache (never downloaded).
        seqlen: ids per context, 2 to 2**24 (2049 = 2048 inputs and their next-token targets).
        chunk_size: contexts per shard (tar file).
        num_local_cells: shuffle cells ``C`` (default: one per 65,536 contexts); part of the
            order (docs/format.md §5).
        local_cell_dir: scratch folder for stage 1's spill files (default: inside ``output``).
        seed: the shuffle's seed.
        threads: worker threads, at most 4096 (default: all cores); for ``engine="ray"`` the CPUs of each task.
        text_key: the JSON key holding each document's text.
        format: tar members: ``"npy"`` (one context each, fixed size, memory-mapped by the
            reader), ``"json.gz"`` (what open_lm reads with ``--data-key json.gz``),
            ``"blocks"`` (2-D npy arrays of ``block_size`` contexts: about 2.01 bytes per uint16
            id) or ``"blocks.zst"`` (those arrays zstd-compressed); docs/format.md §3.
        block_size: contexts per member of the block formats (default 64).
        tail: each file's last partial context: ``"stitch"`` the tails of all files together
            after the last file (padding once per cache), ``"pad"`` it alone, or ``"drop"`` it.
        eot_id: the id ending every document (default: the tokenizer's end-of-text token).
        pad_id: the padding id (default: the tokenizer's padding token, else EOT).
        bos: start every document with ``bos_id``.
        bos_id: the BOS id (default: the tokenizer's, when ``bos``).
        allow_special_tokens: encode special-token strings in the text as their control ids
            (plain ``encode``), for tokenizer.json files; by default they are ordinary text.
        shuffle: shuffle all contexts exactly (default). ``False`` keeps each file's order,
            interleaves files by chunk, and streams: chunks are written (and listed in
            manifest.jsonl) while the inputs are still being tokenized.
        memory_limit: bound, in bytes, on the memory that grows with the input: stage 2's
            shuffle ids and its read windows (default: half of the machine's memory; docs/building.md,
            "Large builds"). A line longer than an eighth of it (at least 16 MiB) stops the build.
        errors: a bad line (bad JSON, missing text, invalid UTF-8, truncated compression):
            ``"raise"`` stops with its file and line, ``"skip"`` skips and counts it by reason
            in tokshuf.json.
        progress: show progress on a terminal and print the summary afterwards.
        overwrite: discard what ``output`` holds (only files tokshuf writes) and start over.
        tokenizer_backend: ``"auto"`` (tokshuf's fast BPE where it is exact for this
            tokenizer, else the reference), ``"fast"`` (an error where it cannot be used) or
            ``"reference"``; the ids are the same (docs/fast-tokenizer.md).
        packing: ``"concat"`` (documents run together, cut every ``seqlen`` ids),
            ``"bestfit"`` (documents placed whole into padded contexts by best-fit decreasing;
            only documents longer than ``seqlen`` are split; ``tail`` does not apply) or
            ``"none"`` (every document, cut at ``seqlen``, is an example of its own length,
            stored by length bin in sub-caches ``bin_KK/``; docs/format.md §4.2).
        pack_window: documents considered together by ``"bestfit"`` (default 1024).
        bins: with ``packing="none"``, the bins' upper bounds, increasing, the last being
            ``seqlen``.
        bin_size: with ``packing="none"``, equal-width bins of this many ids instead (default
            ``ceil(seqlen / 16)``).
        engine: ``"local"`` (this machine) or ``"ray"`` (tasks on a Ray cluster,
            ``pip install "tokshuf[ray]"``; docs/distributed.md). The cache is byte-identical
            either way but for tokshuf.json's ``build``.
        ray_address: the Ray cluster to join (``engine="ray"`` only): ``"auto"`` (default) joins
            the running cluster, else a local one is started.
        shuffle_only: take tar shards of contexts (a tokshuf cache's, or tokshuf-rs's) as inputs
            instead of jsonl: each ``.npy`` or ``.json.gz`` member is one context, shuffled again
            exactly as a build shuffles (directories are searched for ``.tar`` files).
            ``tokenizer`` and ``seqlen`` must be those the shards were made with; nothing that
            shapes contexts from documents (``tail``, ``packing``, ``bos``, ``text_key``) applies.

    Returns:
        The build's counts and its whole tokshuf.json (:class:`BuildStats`).

    Raises:
        InputError: a bad line (with ``errors="raise"``), with its file, line and reason.
        InputNotFoundError: an input that does not exist or matches no file.
        TokenizerError: a tokenizer spec that cannot be loaded, or no EOT id.
        ConfigError: an invalid option.
        OutputExistsError: ``output`` holds something else than this build.
        DiskFullError: the disk filled up (free space and run again to resume).
    """
    stats = run_build(**locals())
    if progress and sys.stderr.isatty():
        print(stats.summary(), file=sys.stderr)
    return stats


def run_build(inputs: Union[PathLike, Iterable[PathLike]], output: PathLike, **options: Any) -> BuildStats:
    """``build_cache`` without printing its summary (the CLI prints it on stdout). The core
    checks every option. ``ext`` (the CLI's): the file names directories are searched for."""
    suffixes = input_suffixes(options.pop("ext", None), bool(options.get("shuffle_only")))
    engine, ray_address = options.pop("engine", "local"), options.pop("ray_address", None)
    if engine not in ("local", "ray"):
        raise ConfigError(f"engine must be 'local' or 'ray', not {engine!r}")
    if ray_address is not None and engine != "ray":
        raise ConfigError("ray_address is an option of engine='ray'")
    output = location(output)
    if is_url(output) and engine == "local":
        local, overwrite = options.pop("local_cell_dir", None), options.pop("overwrite", False)
        return build_to_url(run_build, inputs, output, local, overwrite, **options)
    local = options.get("local_cell_dir")
    exclude = [output] if local is None else [output, local]
    options.update(
        # Absolute: the core records them relative to their common folder anyway, and tasks of
        # the Ray engine run in other working folders.
        inputs=[p if is_url(p) else os.path.abspath(p) for p in expand_inputs(inputs, suffixes, exclude)],
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

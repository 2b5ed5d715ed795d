"""Type stubs of the compiled module ``tokshuf._core`` (checked by ``mypy.stubtest``)."""

from typing import List, Optional, Tuple

__version__: str

def build_cache(
    inputs: List[str],
    output: str,
    tokenizer: str,
    seqlen: int,
    chunk_size: int,
    num_local_cells: Optional[int],
    local_cell_dir: Optional[str],
    seed: int,
    threads: int,
    text_key: str,
    format: str,
    tail: str,
    eot_id: Optional[int],
    pad_id: Optional[int],
    bos: bool,
    bos_id: Optional[int],
    allow_special_tokens: bool,
    shuffle: bool,
    memory_limit: int,
    errors: str,
    progress: bool,
    overwrite: bool,
) -> str: ...

class Tokenizer:
    def __new__(cls, spec: str, allow_special_tokens: bool = False) -> "Tokenizer": ...
    @property
    def spec(self) -> str: ...
    @property
    def sha256(self) -> str: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def backend(self) -> str: ...
    @property
    def eot_id(self) -> Optional[int]: ...
    @property
    def pad_id(self) -> Optional[int]: ...
    @property
    def bos_id(self) -> Optional[int]: ...
    def encode(self, text: str) -> List[int]: ...
    def encode_batch(self, texts: List[str], threads: int = 0) -> List[List[int]]: ...
    def decode(self, ids: List[int]) -> str: ...

def parse_line(line: bytes, key: str = "text") -> Tuple[str, Optional[str]]: ...

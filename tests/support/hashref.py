"""`rust/tokshuf-core/src/hash.rs` reimplemented in Python, for the test references of the
shuffle (DESIGN §5) and the reader's order (DESIGN §6). Pinned against Rust by golden values."""

from __future__ import annotations

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
DOMAIN_CELL = 0x63656C6C  # "cell"
DOMAIN_CELL_SHUFFLE = 0x73687566  # "shuf"
DOMAIN_CHUNK_PERM = 0x6368756E  # "chun"
DOMAIN_CONTEXT_PERM = 0x63747870  # "ctxp"


def mix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def combine(h: int, x: int) -> int:
    return mix64(h ^ ((((x + GOLDEN) & MASK) * GOLDEN) & MASK))


def cell_hash(seed: int, file: int, pos: int) -> int:
    return combine(combine(combine(DOMAIN_CELL, seed), file), pos)


class SplitMix64:
    def __init__(self, seed: int):
        self.state = seed & MASK

    def next_u64(self) -> int:
        self.state = (self.state + GOLDEN) & MASK
        return mix64(self.state)

    def below(self, n: int) -> int:
        """Lemire's multiply-and-reject: uniform in 0..n."""
        m = self.next_u64() * n
        if (m & MASK) < n:
            threshold = ((1 << 64) - n) % n
            while (m & MASK) < threshold:
                m = self.next_u64() * n
        return m >> 64


def fisher_yates(items: list, rng: SplitMix64) -> list:
    for i in range(len(items) - 1, 0, -1):
        j = rng.below(i + 1)
        items[i], items[j] = items[j], items[i]
    return items


def cell_rng(seed: int, cell: int) -> SplitMix64:
    return SplitMix64(combine(combine(DOMAIN_CELL_SHUFFLE, seed), cell))


class Permutation:
    """4-round Feistel network over the smallest even-bit power of two >= n, cycle-walking."""

    def __init__(self, n: int, key: int) -> None:
        self.n, self.key = n, key
        self.half = max(1, ((n - 1).bit_length() + 1) // 2) if n > 0 else 1

    def _round(self, x: int) -> int:
        mask = (1 << self.half) - 1
        left, right = x >> self.half, x & mask
        for k in range(4):
            f = combine(combine(self.key, k), right) & mask
            left, right = right, left ^ f
        return (left << self.half) | right

    def apply(self, i: int) -> int:
        if self.n <= 1:
            return i
        x = self._round(i)
        while x >= self.n:
            x = self._round(x)
        return x

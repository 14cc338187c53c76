"""Per-data-file key filters: which files may hold some of a flush's keys, without reading them (pure).

A flush's key lookup needs the rows of its keys, and fresh keys touch every (type, bucket)
partition: reading every file of those partitions made a flush's lookup follow the table's live
rows, not the batch (issues 13 and 21). A :class:`KeyFilter` is a blocked Bloom filter over one data
file's key column, built from the rows when the file is written (or first read): each key sets
:data:`K` bits in one 64-bit word. It never says "absent" for a key the file holds (no false
negatives: a missed row would be a second live row of the key); it says "maybe" for a key it does
not hold a few times in 10^4 probes (:data:`BITS_PER_KEY` bits a key), which only costs a read.

A flush hashes its keys once; probing is vectorized (four pyarrow calls a file, over the flush's
keys of the file's partition), so a flush's cost follows its keys and the files of the partitions
they touch, not the rows in those files.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.transforms import BucketTransform
from pyiceberg.types import StringType

#: Filter size: 40 bits (5 bytes) a key, rounded up to a power of two of 64-bit words (5-10 bytes a key).
BITS_PER_KEY = 40
#: Bits a key sets in its word (five 6-bit fields of its second hash).
K = 5
#: Files with fewer rows get no filter and are read whole: reading a few thousand cached rows costs
#: less than a filter's probe on every flush (~30 us) and its build (~0.6 ms + 0.6 us a key).
MIN_ROWS = 2048

_MURMUR = BucketTransform(2**31 - 1).pyarrow_transform(StringType())  # Iceberg's murmur3, vectorized


def key_hashes(values: pa.Array | pa.ChunkedArray) -> tuple[pa.Array, pa.Array]:
    """Two independent 31-bit hashes (int64) of string ``values``: murmur3 of the value with two
    different suffixes. Deterministic, so filters built in one process probe in any other.

    Never murmur3 of the value itself: that is Iceberg's bucket hash, so within one partition
    (one bucket) its low bits are all equal and the keys would crowd a fraction of the words
    (a 4-bucket layout saw ~1 % false positives instead of ~10^-4)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    values = values.cast(pa.string())
    return _suffixed_hash(values, "\x01"), _suffixed_hash(values, "\x02")


def _suffixed_hash(values: pa.Array, suffix: str) -> pa.Array:
    return pc.fill_null(_MURMUR(pc.binary_join_element_wise(values, suffix, "")), 0).cast(pa.int64())


def _patterns(second: pa.Array) -> pa.Array:
    """Each key's :data:`K` bits within its word (uint64), from five 6-bit fields of its second hash."""
    one = pa.scalar(1, pa.uint64())
    bits: pa.Array | None = None
    for i in range(K):
        shift = pc.bit_wise_and(pc.shift_right(second, 6 * i), 63).cast(pa.uint64())
        bit = pc.shift_left(one, shift)
        bits = bit if bits is None else pc.bit_wise_or(bits, bit)
    assert bits is not None
    return bits


def _words_for(keys: int) -> int:
    """The word count of a filter of ``keys`` keys: a power of two (a slot is a bit mask of a hash)."""
    words = 1
    while words * 64 < keys * BITS_PER_KEY:
        words *= 2
    return words


def _slots(first: pa.Array, words: int) -> pa.Array:
    return pc.bit_wise_and(first, words - 1)


@dataclass(frozen=True)
class KeyFilter:
    """The key filter of one data file: 64-bit words (uint64), a power of two of them."""

    words: pa.Array

    @classmethod
    def build(cls, values: pa.Array | pa.ChunkedArray) -> KeyFilter:
        """The filter of a file whose key column holds ``values`` (every row, deleted ones too)."""
        first, second = key_hashes(values)
        n = _words_for(len(first))
        held = array("Q", bytes(8 * n))
        # No OR-aggregation in pyarrow: set the words in one Python pass (once per file, ~100 ns a key).
        for slot, pattern in zip(_slots(first, n).to_pylist(), _patterns(second).to_pylist(), strict=True):
            held[slot] |= pattern
        return cls(pa.Array.from_buffers(pa.uint64(), n, [None, pa.py_buffer(held)]))

    @property
    def nbytes(self) -> int:
        return int(self.words.nbytes)

    def to_bytes(self) -> bytes:
        """The words as stored (native byte order): what :meth:`from_bytes` reads back."""
        buf = self.words.buffers()[1]
        assert buf is not None
        return bytes(buf.slice(self.words.offset * 8, 8 * len(self.words)).to_pybytes())

    @classmethod
    def from_bytes(cls, data: bytes) -> KeyFilter | None:
        """The filter :meth:`to_bytes` gave, without copying; None for anything that cannot be one
        (a word count that is not a power of two: a torn or foreign file is a miss, never a filter)."""
        n = len(data) // 8
        if not n or len(data) % 8 or n & (n - 1):
            return None
        return cls(pa.Array.from_buffers(pa.uint64(), n, [None, pa.py_buffer(data)]))

    def may_hold(self, probe: Probe) -> bool:
        """False only when the file holds none of ``probe``'s keys."""
        if not probe.count:
            return False
        slots, patterns = probe.at(len(self.words))
        found = pc.bit_wise_and(self.words.take(slots), patterns)
        return bool(pc.any(pc.equal(found, patterns)).as_py())


@dataclass
class Probe:
    """Some keys, hashed once, to test against many :class:`KeyFilter` (one flush, one partition)."""

    first: pa.Array
    patterns: pa.Array
    _slots: dict[int, pa.Array] = field(default_factory=dict)

    @classmethod
    def of(cls, values: pa.Array | pa.ChunkedArray) -> Probe:
        first, second = key_hashes(values)
        return cls(first, _patterns(second))

    @property
    def count(self) -> int:
        return len(self.first)

    def subset(self, positions: pa.Array) -> Probe:
        """The keys at ``positions`` (int64), hashed already: one flush hashes its keys once."""
        return Probe(self.first.take(positions), self.patterns.take(positions))

    def at(self, words: int) -> tuple[pa.Array, pa.Array]:
        """The keys' slots in a filter of ``words`` words (cached: files share a few sizes), and patterns."""
        slots = self._slots.get(words)
        if slots is None:
            slots = self._slots[words] = _slots(self.first, words)
        return slots, self.patterns

"""Column builders shared by the synthetic-data benchmarks (goodput.py, scale.py)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["uint64_hex", "dictionary"]

_DIGITS = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def uint64_hex(keys: np.ndarray, width: int = 16) -> pa.Array:
    """uint64 keys as lowercase hex strings of ``width`` digits (the key, zero-padded on the right),
    built from buffers so 10M ids take a fraction of a second."""
    raw = keys.astype(">u8").view(np.uint8).reshape(-1, 8)
    chars = np.empty((len(keys), 16), dtype=np.uint8)
    chars[:, 0::2], chars[:, 1::2] = _DIGITS[raw >> 4], _DIGITS[raw & 15]
    if width > 16:
        chars = np.concatenate([chars, np.full((len(keys), width - 16), ord("0"), np.uint8)], axis=1)
    offsets = np.arange(len(keys) + 1, dtype=np.int32) * width
    return pa.Array.from_buffers(pa.string(), len(keys), [None, pa.py_buffer(offsets), pa.py_buffer(chars.tobytes())])


def dictionary(codes: np.ndarray, values: list[str]) -> pa.Array:
    """A dictionary column; a negative code is null."""
    codes = np.asarray(codes)
    return pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32), mask=codes < 0),
                                          pa.array(values, pa.string()))

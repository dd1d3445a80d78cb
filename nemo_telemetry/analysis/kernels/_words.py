"""Small pieces the compiled ingest kernels share (numba): unaligned 8-byte loads and stores,
and integers written as decimal text.

Both the protobuf walk and the JSON scan read bytes a word at a time; numba has no unaligned
word access of a uint8 array, so these emit the LLVM load/store directly. The value-string
builder and the attribute promotion both write integer values as the schema's decimal string.
Numba's cache does not notice a change here in the kernels that inline them: clear
``__pycache__`` after editing.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import types
from numba.extending import intrinsic


@intrinsic
def load8(typingctx, array, index):
    """The 8 bytes of a uint8 ``array`` at ``index`` as one little-endian uint64 (any alignment)."""

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        word = builder.bitcast(builder.gep(data, [args[1]]), ir.IntType(64).as_pointer())
        return builder.load(word, align=1)

    return types.uint64(array, index), codegen


@intrinsic
def store8(typingctx, array, index, value):
    """``array[index:index + 8] = value`` (little-endian, any alignment)."""

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        word = builder.bitcast(builder.gep(data, [args[1]]), ir.IntType(64).as_pointer())
        builder.store(args[2], word, align=1)
        return context.get_dummy_value()

    return types.void(array, index, value), codegen


@njit(cache=True, nogil=True, inline="always")
def magnitude(value):
    """|value| as uint64, right for the most negative int64 too."""
    if value < 0:
        return np.uint64(-(value + 1)) + np.uint64(1)
    return np.uint64(value)


@njit(cache=True, nogil=True, inline="always")
def decimal_size(value):
    """Bytes of the int64 ``value`` in decimal, its sign included."""
    rest = magnitude(value)
    size = 1 if value >= 0 else 2
    while rest >= np.uint64(10):
        rest //= np.uint64(10)
        size += 1
    return size


@njit(cache=True, nogil=True, inline="always")
def write_decimal(out, at, end, value):
    """``value`` in decimal at ``out[at:end]`` (``end - at`` is its :func:`decimal_size`)."""
    rest = magnitude(value)
    pos = end - 1
    while True:
        out[pos] = 48 + np.uint8(rest % np.uint64(10))
        rest //= np.uint64(10)
        pos -= 1
        if rest == np.uint64(0):
            break
    if value < 0:
        out[at] = 45

"""Unaligned 8-byte loads and stores for the compiled ingest kernels (numba intrinsics).

Both the protobuf walk and the JSON scan read bytes a word at a time; numba has no unaligned
word access of a uint8 array, so these emit the LLVM load/store directly. Numba's cache does not
notice a change here in the kernels that inline them: clear ``__pycache__`` after editing.
"""

from __future__ import annotations

from llvmlite import ir
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

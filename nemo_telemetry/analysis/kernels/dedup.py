"""The span deduplication set's one entry point for the store: each function of
``_dedup_kernel`` through the seam (:mod:`.compiled`), else the same function of
``_dedup_reference``. Both keep the same hash set, so either may take any call."""

from __future__ import annotations

from nemo_telemetry.analysis.kernels import _dedup_reference
from nemo_telemetry.analysis.kernels import compiled

__all__ = ["dedup"]


def dedup(function: str, rows: int, *args):
    """``function`` (``admit``, ``contains``, ``forget``, ``rehash``, ``id_words``) on ``args``:
    the compiled kernel when the seam takes ``rows`` of work to it, else the reference path."""
    reference = getattr(_dedup_reference, function)
    return compiled.run(("_dedup_kernel",), rows, lambda k: getattr(k, function)(*args), lambda: reference(*args), unit="rows")

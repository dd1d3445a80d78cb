"""Compile every ingest kernel once, ahead of time: for a Docker image's build step, a Ray
``runtime_env`` setup hook, or ``make``, so that no later command waits for the compiler.

A small synthetic dump of each format is ingested with the compiled paths forced on
(``NEMO_TELEMETRY_COMPILED=1``), which compiles the signatures ingest uses into the kernel
cache (``kernels.compiled.cache_dir``); when they are cached already this takes a second or two.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nemo_telemetry.analysis.kernels import compiled as _compiled
from nemo_telemetry.analysis.ingestion._columns import SpanColumns
from nemo_telemetry.analysis.ingestion._otlp_json import decode_json_request
from nemo_telemetry.analysis.store.dataset import SpanDeduplicator, span_keys
from nemo_telemetry.analysis.ingestion.ingest import ingest
from nemo_telemetry.analysis.synthetic import synthetic_requests, to_protobuf, write_json_lines, write_length_prefixed
from nemo_telemetry.environment_variables import NEMO_TELEMETRY_COMPILED

__all__ = ["KernelWarmUp", "kernels_compiling", "warm_up_kernels"]


@dataclass(frozen=True)
class KernelWarmUp:
    """What :func:`warm_up_kernels` did: the cache directory (None: nothing writable, nothing
    cached), each kernel module with its compiled functions, the ones that failed (module ->
    why; their reference paths serve instead), and the seconds it took."""

    cache_dir: Path | None
    compiled: tuple[tuple[str, tuple[str, ...]], ...]
    failed: tuple[tuple[str, str], ...]
    seconds: float


def kernels_compiling() -> bool:
    """Whether the compiled kernels are compiling now (nothing cached for them): a progress
    display shows it, since no progress is reported meanwhile."""
    return _compiled.compiling()


def warm_up_kernels() -> KernelWarmUp:
    """Compile (or load from the cache) every kernel with the signatures ingest uses."""
    start = time.perf_counter()
    saved = os.environ.get(NEMO_TELEMETRY_COMPILED)
    os.environ[NEMO_TELEMETRY_COMPILED] = "1"
    try:
        with tempfile.TemporaryDirectory(prefix="nemo-telemetry-warmup-") as tmp:
            requests = list(synthetic_requests(64, spans_per_request=16, ranks=2, run_id="warmup"))
            json_dump = write_json_lines(Path(tmp) / "warmup.jsonl", requests)
            proto_dump = write_length_prefixed(Path(tmp) / "warmup.pb", [to_protobuf(r) for r in requests])
            out = Path(tmp) / "dataset"
            ingest([json_dump], out=out)
            ingest([proto_dump], out=out)  # reads the first one's keys back: id words, dedup
            cols = SpanColumns()
            decode_json_request(requests[0], cols)  # the reference decoder's attribute promotion
            tables = cols.to_tables()
            dedup = SpanDeduplicator()
            dedup.admit(tables.spans)
            dedup.forget(span_keys(tables.spans)[:1])
            dedup.contains(span_keys(tables.spans))
            many = np.arange(3 * 1024, dtype=np.uint64).reshape(-1, 3)
            dedup.admit(tables.spans, np.concatenate([many] * 2))  # past half full: the set grows (rehash)
    finally:
        if saved is None:
            os.environ.pop(NEMO_TELEMETRY_COMPILED, None)
        else:
            os.environ[NEMO_TELEMETRY_COMPILED] = saved
    compiled = tuple((name, tuple(functions)) for name, functions in _compiled.warm_up_targets())
    return KernelWarmUp(_compiled.cache_dir(), compiled, tuple(sorted(_compiled.broken().items())),
                        time.perf_counter() - start)

"""The seam in front of the compiled kernels (``compiled``): which path a batch takes, what a
broken kernel costs, where the cache goes.

Failures are forced through the documented test hook ``NEMO_TELEMETRY_KERNEL_FAULT`` (the
seam's own import/compile/call code, with a real numba typing error for ``compile``); each
ingest's tables must equal the reference path's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from nemo_telemetry.analysis import CompiledPathWarning, ingest, read_events, read_spans
from nemo_telemetry.analysis.kernels import compiled as _compiled
from nemo_telemetry.analysis.kernels import _dedup_reference
from nemo_telemetry.analysis.store.dataset import SpanDeduplicator, _string_buffers
from nemo_telemetry.analysis.synthetic import synthetic_requests, to_protobuf, write_json_lines, write_length_prefixed


@pytest.fixture
def dumps(tmp_path: Path) -> list[Path]:
    requests = list(synthetic_requests(300, spans_per_request=50, ranks=2, run_id="seam"))
    return [write_json_lines(tmp_path / "a.jsonl", requests[::2]),
            write_length_prefixed(tmp_path / "b.pb", [to_protobuf(r) for r in requests[1::2]])]


def _tables(dumps: list[Path], out: Path) -> tuple[pa.Table, pa.Table]:
    ingest(dumps, out=out)
    spans = read_spans(out).sort_by([("trace_id", "ascending"), ("span_id", "ascending")])
    events = read_events(out)
    return spans, events.sort_by([(c, "ascending") for c in ("trace_id", "span_id", "name")]) if events.num_rows else events


@pytest.fixture
def fresh_seam():
    _compiled._reset_for_tests()
    yield
    _compiled._reset_for_tests()


@pytest.mark.parametrize("fault", ["import", "compile", "call"])
def test_a_failing_kernel_costs_one_warning_and_the_tables_equal_the_reference_paths(
    fault, dumps, tmp_path, monkeypatch, fresh_seam
):
    monkeypatch.setenv("NEMO_TELEMETRY_COMPILED", "0")
    expected = _tables(dumps, tmp_path / "reference")
    monkeypatch.setenv("NEMO_TELEMETRY_COMPILED", "1")
    monkeypatch.setenv("NEMO_TELEMETRY_KERNEL_FAULT", fault)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _tables(dumps, tmp_path / "faulty")
    messages = [str(w.message) for w in caught if issubclass(w.category, CompiledPathWarning)]
    # with a cold kernel cache the seam first announces that it compiles: a notice, not a failure
    failed = [m for m in messages if not m.startswith("compiling the ingest kernels")]
    assert failed, "a failing kernel warns"
    assert all("reference path" in m for m in failed)
    assert len(failed) <= len(_compiled.KERNEL_MODULES)  # once per module, not per batch
    assert set(_compiled.broken()) <= set(_compiled.KERNEL_MODULES) and _compiled.broken()
    for a, b in zip(got, expected):
        assert a.equals(b)


def test_small_inputs_take_the_reference_paths_without_importing_numba(dumps, tmp_path):
    """A fresh process in the default (auto) mode: a small ingest and read never import numba."""
    code = (
        "import sys\n"
        "from nemo_telemetry.analysis import ingest, read_spans\n"
        f"ingest({[str(d) for d in dumps]!r}, out={str(tmp_path / 'ds')!r})\n"
        f"assert read_spans({str(tmp_path / 'ds')!r}).num_rows > 0\n"
        "print('numba' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "NEMO_TELEMETRY_COMPILED"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_auto_mode_takes_the_compiled_path_from_the_threshold(monkeypatch, fresh_seam):
    monkeypatch.setenv("NEMO_TELEMETRY_COMPILED", "auto")
    assert _compiled.kernels("_dedup_kernel", work=_compiled.SMALL_ROWS - 1, unit="rows") is None
    assert _compiled.kernels("_dedup_kernel", work=_compiled.SMALL_ROWS, unit="rows") is not None
    # loaded, it serves small batches too
    assert _compiled.kernels("_dedup_kernel", work=1, unit="rows") is not None
    monkeypatch.setenv("NEMO_TELEMETRY_COMPILED", "0")
    assert _compiled.kernels("_dedup_kernel", work=10**9, unit="rows") is None


def test_dedup_reference_path_keeps_the_same_set_as_the_kernel(monkeypatch, fresh_seam):
    monkeypatch.setenv("NEMO_TELEMETRY_COMPILED", "1")
    (_dedup_kernel,) = _compiled.kernels("_dedup_kernel", work=0)  # through the seam: its cache

    rng = np.random.default_rng(7)
    ids = [(rng.bytes(16).hex(), rng.bytes(8).hex()) for _ in range(3000)]
    ids += [("NOT-HEX", "x"), (ids[0][0].upper(), ids[0][1])]  # an odd id; the same id in capitals
    spans = pa.table({"trace_id": [t for t, _ in ids], "span_id": [s for _, s in ids]})
    trace, span = _string_buffers(spans.column("trace_id")), _string_buffers(spans.column("span_id"))
    words = [np.zeros((len(ids), 3), np.uint64) for _ in range(2)]
    odd = [m.id_words(*trace, *span, w) for m, w in zip((_dedup_kernel, _dedup_reference), words)]
    assert np.array_equal(odd[0], odd[1]) and np.array_equal(words[0], words[1])
    assert odd[0].tolist()[-2:] == [True, False]

    def run(mode: str) -> tuple[list, SpanDeduplicator]:
        monkeypatch.setenv("NEMO_TELEMETRY_COMPILED", mode)
        dedup = SpanDeduplicator()
        first = dedup.admit(spans.slice(0, 2000)).tolist()  # grows the set: rehash
        again = dedup.admit(spans).tolist()
        dedup.forget(words[0][:500])
        found = dedup.contains(words[0][:1000]).tolist()  # a probe: the set is left as it was
        third = dedup.admit(spans.slice(0, 1000)).tolist()
        return [first, again, found, third], dedup

    (compiled, kernel_set), (reference, reference_set) = run("1"), run("0")
    assert compiled == reference
    assert np.array_equal(kernel_set._table, reference_set._table)
    assert reference[2] == [False] * 500 + [True] * 500  # forgotten ones are out, the rest still in
    assert sum(reference[3]) == 500  # the forgotten ones are new again


def test_cache_dir_is_the_first_writable_candidate_keyed_on_the_sources(tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")  # nothing can be made under a regular file, even as root
    chosen = _compiled.cache_dir([blocked / "cache", tmp_path / "second"])
    assert chosen is not None and chosen.parent == tmp_path / "second"
    assert chosen.name == _compiled.cache_dir([tmp_path / "third"]).name  # one digest per source set
    assert _compiled.cache_dir([blocked / "cache"]) is None


@pytest.mark.parametrize("helper", _compiled.KERNEL_HELPERS)
def test_an_edited_kernel_source_gets_its_own_cache_dir(tmp_path, helper):
    """The helpers (``_words.py``, the JSON scan's parts) are compiled into the kernels: editing
    one alone changes the key."""
    here = Path(_compiled.__file__).parent
    for name in _compiled.KERNEL_MODULES + _compiled.KERNEL_HELPERS:
        (tmp_path / f"{name}.py").write_bytes((here / f"{name}.py").read_bytes())
    assert _compiled.source_digest(tmp_path) == _compiled.source_digest()
    with open(tmp_path / f"{helper}.py", "a") as f:
        f.write("# edited\n")
    assert _compiled.source_digest(tmp_path) != _compiled.source_digest()


def test_loading_a_kernel_with_nothing_cached_says_so_once(tmp_path, monkeypatch, fresh_seam):
    monkeypatch.setenv("NEMO_TELEMETRY_COMPILED", "auto")
    monkeypatch.setenv("NEMO_TELEMETRY_KERNEL_CACHE_DIR", str(tmp_path / "empty-cache"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _compiled.kernels("_dedup_kernel", work=_compiled.SMALL_ROWS, unit="rows")
        _compiled.kernels("_flatten_kernel", work=_compiled.SMALL_ROWS, unit="rows")
    notices = [str(w.message) for w in caught if issubclass(w.category, CompiledPathWarning)]
    assert len(notices) == 1 and notices[0].startswith("compiling the ingest kernels")
    assert str(tmp_path / "empty-cache") in notices[0] and "nemo-telemetry warmup" in notices[0]
    assert _compiled.compiling()  # until their first call returns: the ingest progress bar shows it
    _compiled.run(("_dedup_kernel",), _compiled.SMALL_ROWS, lambda k: None, lambda: None, unit="rows")
    _compiled.run(("_flatten_kernel",), _compiled.SMALL_ROWS, lambda k: None, lambda: None, unit="rows")
    assert not _compiled.compiling()


def test_deferred_kernels_take_the_reference_path_whatever_the_work(monkeypatch, fresh_seam):
    monkeypatch.setenv("NEMO_TELEMETRY_COMPILED", "auto")
    with _compiled.deferred("_dedup_kernel"):
        with _compiled.deferred("_dedup_kernel"):  # held twice, released once: still deferred
            pass
        assert _compiled.kernels("_dedup_kernel", work=10**9, unit="rows") is None
        monkeypatch.setenv("NEMO_TELEMETRY_COMPILED", "1")  # forced on: tests of the compiled paths load them
        assert _compiled.kernels("_dedup_kernel", work=1, unit="rows") is not None
    _compiled._reset_for_tests()
    monkeypatch.setenv("NEMO_TELEMETRY_COMPILED", "auto")
    assert _compiled.kernels("_dedup_kernel", work=10**9, unit="rows") is not None


def test_a_receiver_loads_the_kernels_in_the_background_and_serves_meanwhile(monkeypatch, fresh_seam, tmp_path):
    from nemo_telemetry.analysis.ingestion.collect import CollectorServer

    monkeypatch.setenv("NEMO_TELEMETRY_COMPILED", "auto")
    with CollectorServer(tmp_path / "ds", port=0):
        deadline = time.monotonic() + 300  # a cold cache compiles first, in a child process
        while _compiled.kernels(*_compiled.KERNEL_MODULES, work=1) is None:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    assert not _compiled.broken()

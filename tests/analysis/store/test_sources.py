"""One answer to "is this SOURCE a dataset directory or dump files?" for every reader."""

from __future__ import annotations

from pathlib import Path

from nemo_telemetry.analysis.store.dataset import DatasetWriter
from nemo_telemetry.analysis.store.sources import single_dataset, source_items, split_sources


def test_a_source_is_split_into_datasets_and_dump_files_in_order(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    DatasetWriter(first).close()
    DatasetWriter(second).close()
    dump = tmp_path / "traces-1.jsonl"
    dump.write_text("")
    folder = tmp_path / "dumps"
    folder.mkdir()
    assert source_items(str(first)) == [first]
    assert split_sources([second, str(dump), first, folder]) == ([second, first], [dump, folder])
    assert single_dataset(first) == single_dataset([str(first)]) == first
    assert single_dataset([first, second]) is None  # several datasets: read in memory, not partitioned
    assert single_dataset(dump) is None and single_dataset(folder) is None
    assert single_dataset(tmp_path / "missing") is None


def test_every_reader_takes_a_dataset_and_its_dump_files_alike(tmp_path):
    """spans, logs and metrics of a dataset given as a one-item list are those of the directory."""
    from nemo_telemetry.analysis import read_for_analysis, read_logs, read_spans

    root = tmp_path / "ds"
    DatasetWriter(root).close()
    assert read_for_analysis([root]).num_rows == read_for_analysis(root).num_rows == read_spans(root).num_rows == 0
    assert read_logs([Path(root)]).num_rows == 0

"""The enabled span groups: ingest writes them as a column of their own, and ``check`` reads that
column (in-memory tables, with the resource map too); files written before the column are of a
layout before dataset format 1, refused by every engine with the format and the fix."""

from __future__ import annotations

import json

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nemo_telemetry.analysis.engines.choose import check_with_engine
from nemo_telemetry.analysis.engines.partitioned_check import stream_check
from nemo_telemetry.analysis.findings.checks import check_run, check_span_files
from nemo_telemetry.analysis.decode import SPAN_GROUPS_ATTRIBUTE, SpanReader
from nemo_telemetry.analysis.ingestion.read import read_for_analysis
from nemo_telemetry.analysis.model.records import spans_table
from nemo_telemetry.analysis.store.commits import committed_files
from nemo_telemetry.errors import DatasetFormatError

from test_streaming_check import write_check_scenario


def as_old_layout(path: Path) -> None:
    """Rewrite one spans file as it was written before the ``span_groups`` column: each span's value
    back in ``resource_attributes`` and no such column (the other columns and their types as they were)."""
    table = pq.read_table(path)
    groups = table.column("span_groups").to_pylist()
    maps = [list(m) + ([(SPAN_GROUPS_ATTRIBUTE, g)] if g is not None else [])
            for m, g in zip(table.column("resource_attributes").to_pylist(), groups)]
    index = table.schema.get_field_index("resource_attributes")
    field = table.schema.field(index)
    table = table.set_column(index, field, pa.array(maps, field.type)).drop_columns(["span_groups"])
    pq.write_table(table, path)


def with_layout(source: Path, dest: Path, layout: str) -> Path:
    """A copy of the dataset at ``source`` whose spans files are all new (``new``), all old
    (``old``), or mixed: the first file old and the others new (``old-first``), or the reverse
    (``new-first``); ``ds.dataset`` takes its schema from the first file only."""
    shutil.copytree(source, dest)
    files = committed_files(dest, "spans")
    old = {"new": [], "old": files, "old-first": files[:1], "new-first": files[1:]}[layout]
    for path in old:
        as_old_layout(path)
    for record in (dest / "_commits").glob("*.json"):  # an earlier version's records: no file sizes, no format
        content = json.loads(record.read_bytes())
        content.pop("sizes", None)
        content.pop("dataset_format", None)
        record.write_text(json.dumps(content))
    return dest


LAYOUTS = ("new", "old", "old-first", "new-first")


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, Path]:
    """The check scenario (every finding code, span groups on two runs, several files per partition)
    in each layout."""
    base = tmp_path_factory.mktemp("span-groups")
    source = write_check_scenario(base / "source", batch=150)
    return {layout: with_layout(source, base / layout, layout) for layout in LAYOUTS}


def _missing_groups(report) -> list[dict]:
    return [f for f in report.to_dict()["findings"] if f["code"] == "missing-group-spans"]


# The scenario's enabled groups without spans: run-a enabled step,generation,reward,checkpoint on
# some of its processes; run-b step,evaluate,data_plane on one.
EXPECTED_MISSING = [("run-a", "checkpoint", "info"), ("run-a", "reward", "warning"),
                    ("run-b", "data_plane", "info"), ("run-b", "evaluate", "info")]


def _missing(report) -> list[tuple]:
    return sorted((f["run_id"], f["message"].split("'")[1], f["severity"]) for f in _missing_groups(report))


def test_check_reads_the_column_and_not_the_resource_map_of_a_new_dataset(datasets):
    files = committed_files(datasets["new"], "spans")
    assert len(files) > 20 and all("span_groups" in pq.read_schema(f).names for f in files)
    table = read_for_analysis(datasets["new"])
    assert "span_groups" in table.column_names and "resource_attributes" not in table.column_names
    with SpanReader() as read:
        decoded = read.files([str(f) for f in files])
    assert "resource_attributes" not in decoded.table.column_names  # the groups came from the column
    assert decoded.pairs.get().resources[SPAN_GROUPS_ATTRIBUTE]
    assert _missing(check_run(table)) == EXPECTED_MISSING


@pytest.mark.parametrize("layout", ["old", "old-first", "new-first"])
def test_a_dataset_with_files_from_before_the_column_is_refused_by_every_engine(datasets, layout):
    """Whichever file lacks the column (the first, whose schema a dataset of files takes, or
    another): format 0, the column named, the fix given; never a report without those groups."""
    root = datasets[layout]
    for read in (lambda: read_for_analysis(root), lambda: check_with_engine(root), lambda: stream_check(root),
                 lambda: committed_files(root, "spans")):
        with pytest.raises(DatasetFormatError, match=r"dataset format 0 .*has no span_groups column.*re-run "
                                                     r"nemo-telemetry ingest") as raised:
            read()
        assert raised.value.version == 0


@pytest.mark.parametrize("engine", ["memory", "local", "batches", "partitioned"])
def test_every_engine_gives_the_same_report_from_the_column(datasets, engine):
    """A dataset of the current layout whose records name no format (an earlier version's) reads as
    the format its files hold, in memory and file by file: identical reports, every process's groups found."""
    root = datasets["new"]
    expected = check_run(read_for_analysis(root)).to_dict()
    assert _missing(check_run(read_for_analysis(root))) == EXPECTED_MISSING
    files = [str(f) for f in committed_files(root, "spans")]
    report = {"memory": lambda: check_run(read_for_analysis(root)),
              "local": lambda: check_with_engine(root),  # the CLI's local engine
              "batches": lambda: check_span_files(files, batch_rows=64),  # batches across files
              "partitioned": lambda: stream_check(root)}[engine]()
    assert report.to_dict() == expected
    if engine == "partitioned":
        one_run = check_run(read_for_analysis(root), run_id="run-b").to_dict()
        assert stream_check(root, run_id="run-b").to_dict() == one_run


def test_spans_table_promotes_the_span_groups_as_ingest_does():
    """A hand-built table puts the resource attribute in the column (and out of the map); the
    findings read the same either way."""
    record = {"trace_id": "ab" * 16, "span_id": "cd" * 8, "name": "rl.grpo.step", "start_ns": 1, "end_ns": 2,
              "iteration": 1, "resource_attributes": {SPAN_GROUPS_ATTRIBUTE: "step,checkpoint", "host.name": "n0"}}
    row = spans_table([record]).to_pylist()[0]
    assert row["span_groups"] == "step,checkpoint"
    assert dict(row["resource_attributes"]) == {"host.name": "n0"}
    explicit = spans_table([{**record, "span_groups": "step"}]).to_pylist()[0]
    assert explicit["span_groups"] == "step"
    assert dict(explicit["resource_attributes"])[SPAN_GROUPS_ATTRIBUTE] == "step,checkpoint"  # left as given
    findings = _missing_groups(check_run(spans_table([record])))
    assert [f["message"].split("'")[1] for f in findings] == ["checkpoint"]


def test_many_processes_with_their_own_groups_in_one_run_read_alike_from_column_and_map():
    """Twelve processes of one run, each enabling the step and a group of its own: every group
    without spans is found, whether the table holds the groups in the column or in the map."""
    from nemo_telemetry.instrument import REGISTRY

    # nemo_rl's groups: the run's step spans show nemo_rl's code, not Gym's (whose groups are not expected)
    groups = sorted(info.name for info in REGISTRY.catalogue()
                    if info.spans and info.name != "step" and "nemo_rl" in info.namespaces)[:12]
    assert len(groups) == 12
    records = [{"trace_id": "ab" * 16, "span_id": f"{rank + 1:016x}", "name": "rl.grpo.step", "start_ns": 1,
                "end_ns": 2, "iteration": 1, "rank": rank,
                "resource_attributes": {SPAN_GROUPS_ATTRIBUTE: f"step,{group}"}}
               for rank, group in enumerate(groups)]
    in_column = spans_table(records)
    in_map = spans_table([{**r, "span_groups": None} for r in records])
    assert in_column.column("span_groups").null_count == 0 and in_map.column("span_groups").null_count == 12
    for table, enabled in ((in_column, groups), (in_map, groups), (in_column.slice(0, 5), groups[:5])):
        found = sorted((f["run_id"], f["message"].split("'")[1]) for f in _missing_groups(check_run(table)))
        assert found == [("run-1", group) for group in enabled]

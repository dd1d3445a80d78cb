"""The partitioned check (file by file, as the Ray engine runs it) gives check_run's report exactly."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from nemo_telemetry.analysis.ingestion.read import read_for_analysis
from nemo_telemetry.analysis.model.tables import OtlpTables
from nemo_telemetry.analysis.store.dataset import DatasetWriter
from nemo_telemetry.analysis.findings.checks import check_run
from nemo_telemetry.analysis.goodput.census import NOT_A_RUN_CODES
from nemo_telemetry.analysis.model.records import spans_table
from nemo_telemetry.analysis.model.schema import EVENTS_SCHEMA, LINKS_SCHEMA
from nemo_telemetry.analysis.engines.partitioned_check import stream_check
from nemo_telemetry.analysis.model.tree import with_id_keys
from nemo_telemetry.errors import NemoTelemetryError

from test_streaming import S, T0, scenario_records

SPAN_GROUPS = "nemo.telemetry.span_groups"


def check_records(seed: int = 1) -> list[dict]:
    """The goodput scenario plus what the remaining finding codes need, spread over partitions:

    - in run-a, a stamped bucketed phase with a bucketed child on rank 2 and a bucketed grandchild
      on rank 3 (nested-bucket twice, the ancestor found across partitions);
    - a startup trace (separate by design: no detached-trace finding);
    - enabled span groups (resource attribute) with no spans (missing-group-spans), on two runs;
    - run-c, whose step spans carry no rl.iteration (step-without-iteration);
    - in run-a, a generate span on rank 2 that ended in error status, stamped only through its
      step across partitions (failed-step);
    - in run-a, a server span whose caller's spans are not in the data (remote-parent);
    - run-d, bucketed and stamped spans on two ranks and no step span (no-step-spans).
    """
    rng = random.Random(seed)
    records = scenario_records()
    run_a = next(r for r in records if r["run_id"] == "run-a" and r["name"] == "rl.grpo.step")
    trace = run_a["trace_id"]
    groups_a = {SPAN_GROUPS: "step,generation,reward,checkpoint"}

    def add(name, start, end, *, parent=None, rank=0, bucket=None, iteration=None, run="run-a", trace_id=trace,
            resource=None, category=None, status=None, kind=None):
        span_id = f"{rng.getrandbits(64) | 1:016x}"
        records.append({"trace_id": trace_id, "span_id": span_id, "parent_span_id": parent, "name": name,
                        "start_ns": int(start), "end_ns": int(end), "run_id": run, "rank": rank, "bucket": bucket,
                        "iteration": iteration, "resource_attributes": resource or {},
                        "efficiency_category": category,
                        **({"status_code": "error", "status_message": status} if status else {}),
                        **({"kind": kind} if kind else {})})
        return span_id

    t = run_a["start_ns"]
    phase = add("rl.grpo.advantage_calculation", t + 11 * S, t + 12 * S, parent=run_a["span_id"], bucket="overhead",
                iteration=run_a["iteration"], resource=groups_a)
    child = add("rl.vllm.generate", t + 11 * S, t + 11 * S + S // 2, parent=phase, rank=2, bucket="productive",
                resource=groups_a)
    add("rl.vllm.generate_text", t + 11 * S, t + 11 * S + S // 4, parent=child, rank=3, bucket="productive",
        resource=groups_a)
    # a bucketed wait whose efficiency category is declared unbucketed (umbrella-bucket by its category
    # alone), and one whose category may carry a bucket
    add("app.wait", t + 12 * S, t + 12 * S + S // 8, parent=run_a["span_id"], rank=1, bucket="idle",
        iteration=run_a["iteration"], category="idle/refit_event_wait")
    add("app.wait", t + 12 * S + S // 4, t + 12 * S + S // 2, parent=run_a["span_id"], rank=1, bucket="idle",
        iteration=run_a["iteration"], category="idle/refit_bubble")
    add("rl.vllm.generate", t + 12 * S + S // 2, t + 12 * S + S * 3 // 4, parent=run_a["span_id"], rank=2,
        bucket="productive", status="RuntimeError: the generation worker died")
    add("POST /v1/responses", t + 12 * S, t + 12 * S + S // 8, parent=f"{rng.getrandbits(64) | 1:016x}", rank=5,
        kind="server")
    lone = f"{rng.getrandbits(128) | 1:032x}"
    for rank in (1, 2):
        add("rl.vllm.generate", T0 + rank * S, T0 + rank * S + S // 2, rank=rank, bucket="productive", iteration=1,
            run="run-d", trace_id=lone)
    startup = f"{rng.getrandbits(128) | 1:032x}"
    root = add("rl.startup", T0 - 5 * S, T0 - S, trace_id=startup, resource=groups_a)
    add("rl.setup.ray_init", T0 - 5 * S, T0 - 4 * S, parent=root, trace_id=startup)
    add("rl.grpo.validate", T0, T0 + S, run="run-b", rank=1, trace_id=f"{rng.getrandbits(128) | 1:032x}",
        resource={SPAN_GROUPS: "step,evaluate,data_plane"})
    # run-c: a loop that opens its step spans without rl.iteration (numbered per run and process,
    # step-without-iteration at info), their bucketed spans on rank 1 (the walk crosses partitions),
    # and a process (rank 4) that stamps one of its two step spans (the other left out, at warning)
    loop = f"{rng.getrandbits(128) | 1:032x}"
    job = add("rl.grpo.job", T0, T0 + 40 * S, run="run-c", trace_id=loop)
    for k in (3, 1, 2):
        step = add("rl.grpo.step", T0 + k * 10 * S, T0 + k * 10 * S + 5 * S, parent=job, run="run-c",
                   trace_id=loop)
        add("rl.vllm.generate", T0 + k * 10 * S, T0 + k * 10 * S + 4 * S, parent=step, rank=1, bucket="productive",
            run="run-c", trace_id=loop)
    add("rl.grpo.step", T0 + S, T0 + 2 * S, parent=job, rank=4, iteration=7, run="run-c", trace_id=loop)
    add("rl.grpo.step", T0 + 3 * S, T0 + 4 * S, parent=job, rank=4, run="run-c", trace_id=loop)
    rng.shuffle(records)
    return records


def write_check_scenario(root: Path, *, batch: int = 150) -> Path:
    spans = with_id_keys(spans_table(check_records()))
    writer = DatasetWriter(root)
    for offset in range(0, spans.num_rows, batch):
        writer.write(OtlpTables(spans.slice(offset, batch), EVENTS_SCHEMA.empty_table(), LINKS_SCHEMA.empty_table()))
    writer.close()
    return root


@pytest.fixture(scope="module")
def scenario(tmp_path_factory) -> Path:
    """One file per (run, rank) partition."""
    return write_check_scenario(tmp_path_factory.mktemp("check-scenario") / "ds", batch=100_000)


@pytest.fixture(scope="module")
def many_files(tmp_path_factory) -> Path:
    """Every partition cut into several files: steps, traces and clusters of overlaps cross files."""
    return write_check_scenario(tmp_path_factory.mktemp("check-many") / "ds", batch=150)


def test_the_scenario_raises_findings_of_every_code_across_partitions(scenario):
    by_code = check_run(read_for_analysis(scenario)).counts["by_code"]
    assert all(n for code, n in by_code.items() if code not in NOT_A_RUN_CODES), by_code
    assert by_code["nested-bucket"] == 2 and by_code["orphan-span"] == 2  # same made-up parent id in two traces
    umbrella = [f for f in check_run(read_for_analysis(scenario)).findings if f.code == "umbrella-bucket"]
    assert any("app.wait" in f.message and len(f.span_ids) == 1 for f in umbrella), umbrella
    ranks = {p.parent.name for p in (scenario / "spans").rglob("*.parquet")}
    assert {"rank=0", "rank=1", "rank=2", "rank=3"} <= ranks


@pytest.mark.parametrize("options", [
    {},
    {"unattributed_threshold": 0.1},
    {"run_id": "run-a"},
    {"max_findings_per_code": 2, "max_span_ids": 3},  # only the first overlaps / detached traces are collected
    {"run_id": "run-b", "max_findings_per_code": 1, "max_span_ids": 1},
], ids=["defaults", "threshold", "one-run", "capped", "one-run-capped"])
def test_partitioned_check_equals_check_run(scenario, options):
    expected = check_run(read_for_analysis(scenario), **options).to_dict()
    assert stream_check(scenario, **options).to_dict() == expected


@pytest.mark.parametrize("options", [{}, {"max_findings_per_code": 2, "max_span_ids": 3}], ids=["defaults", "capped"])
def test_partitioned_check_equals_check_run_over_many_files(many_files, options):
    assert len(list((many_files / "spans").rglob("*.parquet"))) > 20
    expected = check_run(read_for_analysis(many_files), **options).to_dict()
    assert all(n for code, n in expected["counts"]["by_code"].items() if code not in NOT_A_RUN_CODES), \
        expected["counts"]  # every code a run can raise, across files
    assert stream_check(many_files, **options).to_dict() == expected


def test_overlaps_and_detached_traces_are_decided_on_the_merged_partials():
    """An overlap split over two batches, and a trace whose only root is in another batch than its
    children, are found only once the batches' partials are merged; touching spans never overlap."""
    import numpy as np

    from nemo_telemetry.analysis.findings import rules

    def batch(file, spans):  # (step, start, end) per row
        step, start, end = (np.array(c, dtype=np.int64) for c in zip(*spans))
        clusters, _ = rules.overlap_partial(start, end, step, np.arange(len(step)), tolerance_ns=0)
        return {**clusters, "file": np.full(len(step), file)}

    first, second = batch(0, [(0, 0, 10), (1, 0, 10)]), batch(1, [(0, 5, 15), (1, 10, 20)])
    assert len(rules.overlapping_steps([first])) == len(rules.overlapping_steps([second])) == 0
    assert rules.overlapping_steps([first, second]).tolist() == [0]

    def counts(low, rows, designed):  # one batch's counts of trace (key 7, low)
        return {"run": np.array([0]), "trace": np.array([7], np.uint64), "low": np.array([low], np.uint64),
                "rows": np.array([rows]), "designed": np.array([designed])}

    children, root = counts(5, 3, 3), counts(5, 1, 0)
    assert len(rules.detached_traces(children)["run"]) == 0
    both = {k: np.concatenate([children[k], root[k]]) for k in children}
    assert {k: v.tolist() for k, v in rules.detached_traces(both).items()} == {"run": [0], "trace": [7], "low": [5]}
    # a root of another trace id with the same trace key leaves this trace whole
    other = {k: np.concatenate([children[k], counts(6, 1, 0)[k]]) for k in children}
    assert {k: v.tolist() for k, v in rules.detached_traces(other).items()} == {"run": [0], "trace": [7], "low": [6]}


def test_unknown_run_is_the_same_typed_error(scenario):
    with pytest.raises(NemoTelemetryError, match="run-a") as local:
        check_run(read_for_analysis(scenario), run_id="nope")
    with pytest.raises(NemoTelemetryError, match="run-a") as partitioned:
        stream_check(scenario, run_id="nope")
    assert str(partitioned.value) == str(local.value)


def test_empty_dataset(tmp_path):
    DatasetWriter(tmp_path / "empty").close()
    assert stream_check(tmp_path / "empty").to_dict() == check_run(read_for_analysis(tmp_path / "empty")).to_dict()


@pytest.mark.parametrize("batch_rows", [7, 64, None])
@pytest.mark.parametrize("options", [{}, {"run_id": "run-a"}, {"max_findings_per_code": 2, "max_span_ids": 3}],
                         ids=["defaults", "one-run", "capped"])
def test_the_local_engine_decodes_a_dataset_batch_by_batch_as_the_table_gives(many_files, batch_rows, options):
    """The local engine decodes a dataset as it reads it, batch by batch (each batch's decoded columns
    let go, the key index built on the way): every code's findings as check_run gives them from the
    whole table, whatever the batch."""
    from nemo_telemetry.analysis.engines.choose import check_with_engine
    from nemo_telemetry.analysis.findings.checks import check_span_files
    from nemo_telemetry.analysis.store.read import span_source_files

    expected = check_run(read_for_analysis(many_files), **options).to_dict()
    _, files = span_source_files(many_files)
    assert check_span_files(files, batch_rows=batch_rows, **options).to_dict() == expected
    assert check_with_engine(many_files, **options).to_dict() == expected


def test_spans_written_without_id_keys_are_checked_file_by_file(tmp_path):
    """A writer given spans without the id keys stores them with the keys and parent rows (dataset
    format 1), so check reads the files batch by batch and reports what the whole table does."""
    from nemo_telemetry.analysis.engines.choose import check_with_engine
    from nemo_telemetry.analysis.findings.checks import check_span_files
    from nemo_telemetry.analysis.store.read import span_source_files

    spans = spans_table(check_records())
    assert "span_key" not in spans.column_names
    writer = DatasetWriter(tmp_path / "ds")
    writer.write(OtlpTables(spans, EVENTS_SCHEMA.empty_table(), LINKS_SCHEMA.empty_table()))
    writer.close()
    _, files = span_source_files(tmp_path / "ds")
    expected = check_run(read_for_analysis(tmp_path / "ds")).to_dict()
    assert expected["counts"]["error"] > 0
    assert check_span_files(files, batch_rows=64).to_dict() == expected
    assert check_with_engine(tmp_path / "ds").to_dict() == expected

"""The Ray engine gives the local engine's results, on a real local Ray cluster (shared fixture)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nemo_telemetry.analysis.ingestion.read import read_for_analysis
from nemo_telemetry.analysis.findings.checks import check_run
from nemo_telemetry.analysis.goodput.census import NOT_A_RUN_CODES
from nemo_telemetry.analysis.goodput.steps import goodput_document, run_goodput
from nemo_telemetry.analysis.ingestion.ingest import ingest, read_spans
from nemo_telemetry.analysis.synthetic import synthetic_requests, write_json_lines
from nemo_telemetry.cli.app import app

pytestmark = pytest.mark.slow


def _scenario_module(folder: str, name: str):
    """A scenario generator of tests/analysis/<folder> (one definition for both suites)."""
    analysis = Path(__file__).resolve().parent.parent / "analysis"
    for needed in ("goodput", "engines"):  # test_streaming_check imports test_streaming by name, and so on
        if str(analysis / needed) not in sys.path:
            sys.path.insert(0, str(analysis / needed))
    spec = importlib.util.spec_from_file_location(f"_{name}_scenario", analysis / folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


scenario_tools = _scenario_module("goodput", "test_streaming")
check_tools = _scenario_module("engines", "test_streaming_check")
layout_tools = _scenario_module("store", "test_span_groups_column")


@pytest.fixture(scope="module")
def scenario(tmp_path_factory) -> Path:
    # one ingest batch: a file per (run, rank) partition
    return scenario_tools.write_scenario(tmp_path_factory.mktemp("ray-scenario") / "ds", batch=100_000)


def test_ray_goodput_equals_local(ray_cluster, scenario):
    from nemo_telemetry.analysis.engines.ray_engine import ray_goodput

    expected = scenario_tools.as_plain(run_goodput(read_spans(scenario)))
    assert len(expected) == 3 and expected[1]["outside"]["unstamped_spans"] == 4
    assert scenario_tools.as_plain(ray_goodput(scenario)) == expected
    one_run = scenario_tools.as_plain(run_goodput(read_spans(scenario), run_id="run-b"))
    assert scenario_tools.as_plain(ray_goodput(scenario, run_id="run-b")) == one_run
    by_rank = goodput_document(run_goodput(read_spans(scenario), by="rank"))
    assert goodput_document(ray_goodput(scenario, by="rank")) == by_rank


fleet_tools = _scenario_module("goodput", "test_fleets")


@pytest.mark.parametrize("by", ["fleet", "fleet,step"])
def test_ray_goodput_by_fleet_equals_local(ray_cluster, tmp_path, by):
    """The hand-computed fleet fixtures (their busy and token points in the dataset's metrics/) give
    the in-memory document on Ray, its fleet partials mapped in Ray tasks over files of 3 spans."""
    from nemo_telemetry.analysis.engines.ray_engine import ray_goodput

    with_metrics = {fleet_tools.async_spans: fleet_tools.async_metrics,  # the busy metric alone
                    fleet_tools.async_refit_spans: fleet_tools.async_metrics,  # spans and the busy metric
                    fleet_tools.split_spans_and_busy: fleet_tools.split_both_metrics}
    for fixture in (fleet_tools.split_spans, fleet_tools.colocated_spans, *with_metrics):
        records = fixture()
        metrics = with_metrics[fixture]() if fixture in with_metrics else None
        root = fleet_tools.write_dataset(tmp_path / fixture.__name__ / by.replace(",", "_"), records, metrics=metrics)
        expected = goodput_document(run_goodput(fleet_tools.spans_table(records), by=by, metrics=metrics))
        assert expected["runs"][0]["fleets"]
        assert goodput_document(ray_goodput(root, by=by)) == expected


def test_ray_engine_reads_the_committed_state_of_an_incomplete_dataset_and_warns(ray_cluster, scenario, tmp_path):
    """An ingest that began (its start recorded, its spans staged) and did not finish: the Ray
    engine reads what was committed before and says the dataset is incomplete."""
    import shutil

    from nemo_telemetry.analysis import IncompleteDatasetWarning
    from nemo_telemetry.analysis.store.dataset import DatasetWriter
    from nemo_telemetry.analysis.engines.ray_engine import ray_check, ray_goodput

    root = tmp_path / "ds"
    shutil.copytree(scenario, root)
    more = tmp_path / "more.jsonl"
    write_json_lines(more, synthetic_requests(550, spans_per_request=55, ranks=2))
    writer = DatasetWriter(root)
    writer.start([str(more)])
    writer.write(_tables_of(more))
    writer.abort()
    expected = scenario_tools.as_plain(run_goodput(read_spans(scenario)))
    with pytest.warns(IncompleteDatasetWarning, match=f"incomplete.*{more}"):
        assert scenario_tools.as_plain(ray_goodput(root)) == expected
    with pytest.warns(IncompleteDatasetWarning, match="incomplete"):
        assert ray_check(root).to_dict() == check_run(read_for_analysis(scenario)).to_dict()


def _tables_of(path: Path):
    """The tables of a dump file, as a writer takes them."""
    from nemo_telemetry.analysis import load_traces
    from nemo_telemetry.analysis.model.tables import OtlpTables

    loaded = load_traces(path)
    return OtlpTables(loaded.spans, loaded.events, loaded.links)


@pytest.fixture(scope="module")
def check_scenario(tmp_path_factory) -> Path:
    """Findings of every code, each partition cut into several files (steps and traces cross files)."""
    return check_tools.write_check_scenario(tmp_path_factory.mktemp("ray-check") / "ds", batch=150)


@pytest.mark.parametrize("options", [
    {},  # every finding code
    {"max_findings_per_code": 2, "max_span_ids": 3},  # the first overlaps / detached traces collected by tasks
    {"run_id": "run-a"},
], ids=["defaults", "capped", "one-run"])
def test_ray_check_equals_check_run(ray_cluster, check_scenario, options):
    from nemo_telemetry.analysis.engines.ray_engine import ray_check

    expected = check_run(read_for_analysis(check_scenario), **options).to_dict()
    codes_hit = sum(1 for n in expected["counts"]["by_code"].values() if n)
    can_hit = len(expected["counts"]["by_code"]) - len(NOT_A_RUN_CODES)  # those say there is no RL span at all
    assert codes_hit == can_hit if not options else codes_hit >= 10
    assert ray_check(check_scenario, **options).to_dict() == expected


@pytest.mark.parametrize("layout", ["old", "new-first"])
def test_ray_refuses_a_dataset_with_files_from_before_the_span_groups_column(ray_cluster, check_scenario, tmp_path,
                                                                            layout):
    """Every file, or all but the first, as written before the ``span_groups`` column (a layout before
    dataset format 1): the Ray engine refuses it as the local one does, with the format and the fix."""
    from nemo_telemetry.analysis.engines.ray_engine import ray_check, ray_goodput
    from nemo_telemetry.errors import DatasetFormatError

    old = layout_tools.with_layout(check_scenario, tmp_path / layout, layout)
    for run in (lambda: ray_check(old), lambda: ray_goodput(old)):
        with pytest.raises(DatasetFormatError, match=r"dataset format 0 .*has no span_groups column.*re-run "
                                                     r"nemo-telemetry ingest"):
            run()


def test_cli_check_on_ray_equals_local(ray_cluster, check_scenario):
    runner = CliRunner()
    outputs = {}
    for engine in ("local", "ray"):
        result = runner.invoke(app, ["check", str(check_scenario), "--format", "json", "--unattributed-threshold",
                                     "0.1", "--engine", engine])
        assert result.exit_code == 1, result.output  # the scenario has error findings
        outputs[engine] = json.loads(result.stdout)  # Ray's worker logs, if any, are on stderr
    expected = check_run(read_for_analysis(check_scenario), unattributed_threshold=0.1).to_dict()
    assert all(n for code, n in expected["counts"]["by_code"].items() if code not in NOT_A_RUN_CODES)
    assert expected["counts"]["error"] > 0
    assert outputs["ray"] == outputs["local"]
    assert outputs["ray"]["counts"] == expected["counts"]


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> Path:
    """Four JSON-lines files: three parts of a run, a repeat of the first (duplicates), one bad line."""
    folder = tmp_path_factory.mktemp("dumps")
    requests = list(synthetic_requests(3_000, spans_per_request=200, ranks=4))
    thirds = [requests[i::3] for i in range(3)]
    for i, part in enumerate(thirds):
        write_json_lines(folder / f"traces-{i}.jsonl", part)
    write_json_lines(folder / "traces-3-repeat.jsonl", thirds[0][:4])
    with open(folder / "traces-1.jsonl", "ab") as out:
        out.write(b'{"resourceSpans": [ this is not json\n')
    return folder


def _sorted_spans(root: Path) -> list[dict]:
    spans = read_spans(root)
    return spans.sort_by([("trace_id", "ascending"), ("span_id", "ascending")]).to_pylist()


def test_ray_ingest_writes_the_same_dataset_and_summary(ray_cluster, dumps, tmp_path):
    from nemo_telemetry.analysis.engines.ray_engine import ray_ingest

    local = ingest(dumps, out=tmp_path / "local")
    seen = []
    remote = ray_ingest(dumps, out=tmp_path / "ray", batch_spans=700, progress=lambda b, s: seen.append((b, s)))
    assert local.duplicates_dropped == 4 * 200 and local.rejected_records == 1
    assert remote == local
    assert seen[-1] == (sum(p.stat().st_size for p in dumps.iterdir()), local.spans)
    left, right = _sorted_spans(tmp_path / "local"), _sorted_spans(tmp_path / "ray")
    assert len(left) == local.spans and left == right
    # the Ray-ingested dataset is partitioned by run and rank like the local one
    folders = {p.parent.relative_to(tmp_path / "ray" / "spans").as_posix()
               for p in (tmp_path / "ray" / "spans").rglob("*.parquet")}
    assert folders == {f"run_id=synthetic-run/rank={r}" for r in range(4)}



def test_ray_ingest_writes_the_metrics_and_logs_tables_as_ingest_does(ray_cluster, tmp_path):
    """A metrics dump and a log dump among the inputs: the same metrics and logs tables and summary."""
    from nemo_telemetry.analysis import read_logs
    from nemo_telemetry.analysis.engines.ray_engine import ray_ingest
    from nemo_telemetry.analysis.ingestion.metrics import metrics_for_source

    signals = _scenario_module("ingestion", "test_ingest_one_read")
    folder = tmp_path / "dumps"
    folder.mkdir()
    write_json_lines(folder / "traces-0.jsonl", list(synthetic_requests(400, spans_per_request=100)))
    (folder / "metrics-1.jsonl").write_text("\n".join(signals.metrics_dump_line(i) for i in range(300)) + "\n")
    (folder / "logs-1.jsonl").write_text("\n".join(signals.logs_dump_line(i) for i in range(500)) + "\n")
    # Protobuf metrics and logs under names that say nothing: told by content, never decoded as traces.
    spec = importlib.util.spec_from_file_location("_otlp_signals", Path(__file__).parent.parent / "analysis" / "_otlp_signals.py")
    otlp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(otlp)
    (folder / "export-a.bin").write_bytes(otlp.dump_bytes("metrics", "frames.pb")[0])
    (folder / "export-b.bin").write_bytes(otlp.dump_bytes("logs", "frames.pb", ".zst")[0])
    local = ingest(folder, out=tmp_path / "local")
    remote = ray_ingest(folder, out=tmp_path / "ray", batch_spans=700)
    assert (local.metric_points, local.logs) == (300 + 2 * otlp.POINTS, 500 + 2 * otlp.LOG_RECORDS)
    assert (local.rejected_records, local.warnings) == (0, ())
    assert remote == local
    assert metrics_for_source(tmp_path / "ray").to_pylist() == metrics_for_source(tmp_path / "local").to_pylist()
    assert read_logs(tmp_path / "ray").to_pylist() == read_logs(tmp_path / "local").to_pylist()


overlap_tools = _scenario_module("findings", "test_overlap_tolerance")


@pytest.mark.parametrize("tolerance_s", [0.0, 0.001])
def test_ray_check_honours_the_overlap_tolerance_as_check_run(ray_cluster, tmp_path_factory, tolerance_s):
    from nemo_telemetry.analysis.engines.ray_engine import ray_check

    root = overlap_tools.write_js_dataset(tmp_path_factory.mktemp("ray-js") / "ds")
    expected = check_run(read_for_analysis(root), overlap_tolerance_s=tolerance_s).to_dict()
    assert ray_check(root, overlap_tolerance_s=tolerance_s).to_dict() == expected
    severities = {f["severity"] for f in expected["findings"] if f["code"] == "bucketed-overlap"}
    assert severities == ({"error"} if tolerance_s == 0 else {"error", "info"})


def test_an_unknown_run_is_the_same_error_on_every_engine(ray_cluster, scenario):
    """In memory, out of core a few rows at a time, and on Ray: one message naming the runs present,
    and from the CLI exit 2 with that message, for goodput and check alike."""
    from nemo_telemetry.analysis.engines.ray_engine import ray_check, ray_goodput
    from nemo_telemetry.analysis.goodput.partials import stream_goodput
    from nemo_telemetry.analysis.engines.partitioned_check import stream_check
    from nemo_telemetry.errors import UnknownRunError

    attempts = {
        "goodput in memory": lambda: run_goodput(read_spans(scenario), run_id="nope"),
        "goodput out of core": lambda: stream_goodput(scenario, run_id="nope", batch_rows=50),
        "goodput on ray": lambda: ray_goodput(scenario, run_id="nope"),
        "check in memory": lambda: check_run(read_for_analysis(scenario), run_id="nope"),
        "check out of core": lambda: stream_check(scenario, run_id="nope"),
        "check on ray": lambda: ray_check(scenario, run_id="nope"),
    }
    messages = {}
    for name, attempt in attempts.items():
        with pytest.raises(UnknownRunError) as raised:
            attempt()
        messages[name] = str(raised.value)
    expected = "no run 'nope' in these spans (runs present: 'run-a', 'run-b'); pass one of them as --run / run_id"
    assert messages == dict.fromkeys(attempts, expected)
    runner = CliRunner()
    for command in ("goodput", "check"):
        for engine in ("local", "ray"):
            result = runner.invoke(app, [command, str(scenario), "--run", "nope", "--engine", engine])
            assert result.exit_code == 2, (command, engine, result.output)
            assert expected in result.stderr


tolerance_tools = _scenario_module("engines", "test_one_tolerance")


@pytest.mark.parametrize("tolerance_s", [0.0, 0.001, 0.01])
def test_ray_check_applies_the_tolerance_to_every_interval_code_as_check_run(ray_cluster, tmp_path_factory,
                                                                           tolerance_s):
    """bucketed-overlap, bucket-exceeds-wall and nested-bucket: the same severities on Ray."""
    from nemo_telemetry.analysis.engines.ray_engine import ray_check

    root = tolerance_tools.write_dataset(tmp_path_factory.mktemp("ray-tol") / "ds")
    expected = check_run(read_for_analysis(root), overlap_tolerance_s=tolerance_s).to_dict()
    assert ray_check(root, overlap_tolerance_s=tolerance_s).to_dict() == expected
    want = {0.0: {k: "error" for k in tolerance_tools.WITHIN_DEFAULT}, 0.001: tolerance_tools.WITHIN_DEFAULT,
            0.01: {k: "info" for k in tolerance_tools.WITHIN_DEFAULT}}[tolerance_s]
    assert tolerance_tools.severities(expected) == want


unstamped_tools = _scenario_module("goodput", "test_steps_without_iteration")


def test_ray_numbers_step_spans_without_iteration_as_the_local_engine(ray_cluster, tmp_path_factory):
    """goodput and check on Ray: the same numbered steps, attributed spans and finding, and the CLI."""
    from nemo_telemetry.analysis.engines.choose import CHECK_COLUMNS
    from nemo_telemetry.analysis.engines.ray_engine import ray_check, ray_goodput

    root = tmp_path_factory.mktemp("ray-unstamped")
    mixed = unstamped_tools.loop_records(run="run-mixed", stamped=(1, 3), trace="e" * 32)
    for r in mixed:  # another run in the same dataset: ids of its own
        r["span_id"] = "c" + r["span_id"][1:]
        r["parent_span_id"] = r["parent_span_id"] and "c" + r["parent_span_id"][1:]
    dataset = unstamped_tools.write_dataset(unstamped_tools.loop_records() + mixed, root / "ds")
    local = run_goodput(read_for_analysis(dataset, columns=CHECK_COLUMNS))
    remote = ray_goodput(dataset)
    assert goodput_document(remote) == goodput_document(local)
    steps = {r.run_id: [s["iteration"] for s in r.steps.to_pylist()] for r in remote}
    assert steps == {"run-nemo": [1, 2, 3, 4], "run-mixed": [10, 30]}
    expected = check_run(read_for_analysis(dataset, columns=CHECK_COLUMNS)).to_dict()
    assert ray_check(dataset).to_dict() == expected
    assert sorted((f["run_id"], f["severity"]) for f in expected["findings"] if f["code"] == "step-without-iteration") \
        == [("run-mixed", "warning"), ("run-nemo", "info")]
    result = CliRunner().invoke(app, ["goodput", str(dataset), "--engine", "ray", "--format", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == json.loads(json.dumps(goodput_document(local)))


failed_tools = _scenario_module("goodput", "test_failed_steps")


def test_ray_gives_the_failed_step_of_a_run_whose_reward_raised_as_the_local_engine(ray_cluster, tmp_path_factory):
    """A run written by the instrument, its reward function raising at one step: the Ray engine's
    goodput (per step and by rank) and check are the local engine's, failed step and finding included."""
    from nemo_telemetry.analysis.engines.ray_engine import ray_check, ray_goodput

    root = tmp_path_factory.mktemp("ray-failed")
    failed_tools.run_with_a_failing_reward(root / "dumps")
    ingest([root / "dumps"], out=root / "ingested")
    spans = read_spans(root / "ingested")
    dataset = failed_tools._in_files_of(spans, root / "ds", 4)
    local = goodput_document(run_goodput(spans))
    assert [s["failed"] for s in local["runs"][0]["steps"]] == [False, True, False]
    assert goodput_document(ray_goodput(dataset)) == local
    assert goodput_document(ray_goodput(dataset, by="rank")) == goodput_document(run_goodput(spans, by="rank"))
    expected = check_run(spans).to_dict()
    assert expected["counts"]["by_code"]["failed-step"] == 1
    assert ray_check(dataset).to_dict() == expected


async_tools = _scenario_module("goodput", "test_async_caveat")


def test_ray_gives_an_async_run_its_caveat_as_the_local_engine(ray_cluster, tmp_path_factory):
    from nemo_telemetry.analysis.engines.ray_engine import ray_goodput

    dataset = async_tools.write_dataset(async_tools.records(), tmp_path_factory.mktemp("ray-async") / "ds", per_file=2)
    expected = {r.run_id: r.caveats for r in run_goodput(read_spans(dataset))}
    assert expected["run-sync"] == () and len(expected["run-async"]) == 1
    assert {r.run_id: r.caveats for r in ray_goodput(dataset)} == expected


presence_tools = _scenario_module("findings", "test_group_presence")


def test_ray_check_decides_group_presence_as_check_run(ray_cluster, tmp_path):
    """Runs written by the instrument (each span's recorded group; Gym's groups enabled on a run
    without Gym): the Ray engine's report is the local one, missing-group-spans included."""
    from nemo_telemetry.analysis.engines.ray_engine import ray_check

    ingest([presence_tools.write_group_runs(tmp_path)], out=tmp_path / "ds")
    expected = check_run(read_for_analysis(tmp_path / "ds")).to_dict()
    found = {(f["run_id"], f["message"].split("'")[1]) for f in expected["findings"] if f["code"] == "missing-group-spans"}
    assert ("trl", "advantage") in found and ("trl", "generation") not in found and ("trl", "agent") not in found
    assert ray_check(tmp_path / "ds").to_dict() == expected


identity_tools = _scenario_module("engines", "test_trace_identity_engines")


@pytest.mark.parametrize("layout", ["high-half-shared", "halves-swapped"])
def test_ray_engine_keeps_traces_that_share_half_their_id_apart(ray_cluster, tmp_path, layout):
    """Jaeger's layout (64-bit trace ids padded to 128 bits, span ids 1, 2, 3 in every trace) and
    swapped halves, on Ray: the orphans are each trace's own, and each step's bucketed child takes
    its own trace's iteration, as on the local engine."""
    from nemo_telemetry.analysis import check_with_engine, goodput_with_engine

    first, second = identity_tools.LAYOUTS[layout]
    dump = tmp_path / "dump"
    dump.mkdir()
    (dump / "traces.jsonl").write_text("".join(json.dumps(r) + "\n" for r in identity_tools._requests(first, second)))
    root = tmp_path / "ds"
    ingest([dump], out=root)
    _, orphans = identity_tools._expected(read_spans(root))
    ray_report = check_with_engine(root, engine="ray")
    assert identity_tools._orphans(ray_report) == orphans == {(first, f"{6:016x}"), (second, f"{9:016x}")}
    assert ray_report.to_dict() == check_with_engine(root).to_dict()
    steps = {row["iteration"]: row for row in goodput_with_engine(root, engine="ray")[0].steps.to_pylist()}
    assert (steps[1]["productive_s"], steps[2]["overhead_s"], steps[1]["overhead_s"]) == (4.0, 8.0, 0.0)


def test_ray_engine_names_each_of_two_traces_that_share_a_trace_key(ray_cluster, tmp_path):
    """Two trace ids crafted to share a trace_key, one anchored by a step span and one detached,
    each with an orphan: Ray names each trace in its own findings, as the local engine does."""
    from nemo_telemetry.analysis import check_with_engine

    root, anchored, detached = identity_tools.write_sharing_trace_key(tmp_path)
    ray_report = check_with_engine(root, engine="ray")
    identity_tools.assert_each_trace_named(ray_report, anchored, detached, "ray")
    assert ray_report.to_dict() == check_with_engine(root).to_dict()

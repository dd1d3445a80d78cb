"""``missing-group-spans`` decides presence by the group each span recorded (``rl.span_group``), by
name only for spans that record none, expects a group only where the run holds code of a
namespace that registers it, and names the processes that had the group enabled.

The runs are written by the instrument itself through the dump exporter: a TRL-like trainer
whose generation span has a name no catalogue pattern knows, with ``span_groups: all`` (which
enables Gym's groups too) and no Gym; and the same trainer beside a Gym server process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from typer.testing import CliRunner

from nemo_telemetry.analysis import check_run, check_with_engine, ingest, read_spans
from nemo_telemetry.analysis.engines.partitioned_check import stream_check
from nemo_telemetry.analysis.findings.checks import check_span_files
from nemo_telemetry.analysis.store.commits import committed_files
from nemo_telemetry.cli.app import app
from nemo_telemetry.instrument import (
    REGISTRY,
    GymSpanGroup,
    RLSpanGroup as G,
    init_telemetry_driver,
    init_telemetry_worker,
    iteration_scope,
    managed_span,
    shutdown_telemetry,
    umbrella_span,
)

GENERATE = "trl.generate_completions"  # a trainer's own name for its generation phase: no pattern claims it
GYM_ONLY = sorted(i.name for i in REGISTRY.catalogue() if i.namespaces == ("nemo_gym",))
OPENED = {"job", "step", "generation", "reward", "policy_update"}


def _trainer(run_id: str, dump_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver (``span_groups: all``) and a policy worker (``per_step``) of one run, two steps."""
    monkeypatch.setenv("NEMO_TELEMETRY_RUN_ID", run_id)
    init_telemetry_driver({"enabled": True, "span_groups": "all", "exporter": "dump", "dump_dir": str(dump_dir)},
                          algorithm="grpo", service_name="trainer")
    with umbrella_span(G.U_JOB, "rl.grpo.job"):
        for i in (1, 2):
            with iteration_scope(i), umbrella_span(G.U_STEP, "rl.grpo.step"):
                with managed_span(G.GENERATION, GENERATE):
                    pass
                with managed_span(G.GENERATION, "rl.trl.generate"):
                    pass
                with managed_span(G.REWARD, "rl.grpo.reward_calculation"):
                    pass
    shutdown_telemetry(timeout_s=10)
    monkeypatch.setenv("NEMO_TELEMETRY_SPAN_GROUPS", "per_step")
    init_telemetry_worker(rank=1, service_name="policy-worker")
    with iteration_scope(1), managed_span(G.POLICY_UPDATE, "rl.grpo.policy_training"):
        pass
    shutdown_telemetry(timeout_s=10)


def write_group_runs(root: Path) -> Path:
    """Dumps of run ``trl`` (no Gym) and run ``with-gym`` (the trainer and a Gym server that verified)."""
    dumps = root / "dumps"
    with pytest.MonkeyPatch.context() as mp:
        _trainer("trl", dumps / "trl", mp)
    with pytest.MonkeyPatch.context() as mp:
        _trainer("with-gym", dumps / "gym", mp)
        mp.setenv("NEMO_TELEMETRY_SPAN_GROUPS", "all")
        init_telemetry_worker(rank=0, service_name="gym-server")
        with iteration_scope(1), umbrella_span(GymSpanGroup.VERIFY, "gym.verify"):
            pass
        shutdown_telemetry(timeout_s=10)
    return dumps


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> Path:
    return write_group_runs(tmp_path_factory.mktemp("group-presence"))


@pytest.fixture(scope="module")
def dataset(dumps, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("group-presence-ds") / "ds"
    ingest([dumps], out=out)
    return out


def missing(report) -> dict[tuple[str, str], dict]:
    """(run, group) -> finding dict of every missing-group-spans finding."""
    return {(f["run_id"], f["message"].split("'")[1]): f for f in report.to_dict()["findings"]
            if f["code"] == "missing-group-spans"}


def test_the_dumps_record_each_spans_group_and_ingest_keeps_it_in_a_column(dataset):
    spans = read_spans(dataset)
    groups = dict(zip(spans.column("name").to_pylist(), spans.column("rl.span_group").to_pylist()))
    assert groups[GENERATE] == "generation" and groups["rl.trl.generate"] == "generation"
    assert groups["gym.verify"] == "verify" and groups["rl.grpo.step"] == "step"


def test_a_generation_span_is_present_by_its_group_whatever_its_name(dumps):
    found = missing(check_run(read_spans(dumps)))
    assert not any(group == "generation" for _, group in found)
    rl_groups = {i.name for i in REGISTRY.catalogue() if "nemo_rl" in i.namespaces}
    assert {g for run, g in found if run == "trl"} == rl_groups - OPENED


def test_gym_groups_are_expected_only_in_the_run_that_holds_gym_code(dumps):
    found = missing(check_run(read_spans(dumps)))
    assert not any(group in GYM_ONLY for run, group in found if run == "trl")  # `all` enabled them: no Gym here
    gym = {g: f["severity"] for (run, g), f in found.items() if run == "with-gym" and g in GYM_ONLY}
    assert gym == {"agent": "warning", "model_call": "warning", "sandbox": "warning",
                   "http_client": "info", "server": "info"}  # verify was opened; two are known gaps


def test_the_finding_names_the_processes_that_had_the_group_enabled(dumps):
    found = missing(check_run(read_spans(dumps)))
    advantage = found[("trl", "advantage")]  # per_step on the worker, all on the driver
    assert advantage["severity"] == "warning"
    assert "was enabled in policy-worker rank 1, trainer rank 0, but no span of the run was opened in it" in \
        advantage["message"]
    assert "enabled in trainer rank 0, but" in found[("trl", "per_prompt")]["message"]  # not in per_step
    assert "enabled in gym-server rank 0, trainer rank 0, but" in found[("with-gym", "sandbox")]["message"]


def test_spans_without_a_recorded_group_fall_back_to_their_names(dumps):
    """An older dump (no ``rl.span_group``): the catalogue's patterns place spans; a name they do not
    know places nothing, and gym.verify still shows the Gym run's namespace."""
    spans = read_spans(dumps)
    at = spans.schema.get_field_index("rl.span_group")
    old = spans.set_column(at, spans.schema.field(at), pa.nulls(spans.num_rows, spans.schema.field(at).type))
    found = missing(check_run(old))
    assert ("trl", "generation") not in found  # rl.trl.generate matches rl.<algo>.generate
    assert ("with-gym", "agent") in found and not any(g in GYM_ONLY for run, g in found if run == "trl")
    without_trl_name = old.filter(pa.compute.not_equal(old.column("name"), "rl.trl.generate"))
    assert ("trl", "generation") in missing(check_run(without_trl_name))  # GENERATE is no pattern's


def test_every_engine_and_the_cli_give_the_in_memory_report(dumps, dataset):
    found = missing(check_run(read_spans(dumps)))  # raw dumps in memory (runs in the files' order)
    assert len(found) > 20 and missing(check_run(read_spans(dataset))) == found
    expected = check_run(read_spans(dataset)).to_dict()
    assert check_with_engine(dataset).to_dict() == expected
    assert stream_check(dataset).to_dict() == expected
    files = [str(f) for f in committed_files(dataset, "spans")]
    assert check_span_files(files, batch_rows=5).to_dict() == expected  # small batches across files
    result = CliRunner().invoke(app, ["check", str(dataset), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == expected
    one = check_run(read_spans(dataset), run_id="with-gym").to_dict()
    assert stream_check(dataset, run_id="with-gym").to_dict() == one
    assert all(f["run_id"] == "with-gym" for f in one["findings"])


def test_a_process_that_resolved_its_groups_in_a_namespace_shows_that_namespace(tmp_path, monkeypatch):
    """A Gym server (``nemo_gym``'s ``default``) that opened spans of shared groups only: its
    resolved namespace (``nemo.telemetry.namespace``, ingested into ``span_groups_namespace``) makes
    Gym's groups expected; an older dump without it shows no namespace, and expects none."""
    monkeypatch.setenv("NEMO_TELEMETRY_RUN_ID", "gym-run")
    init_telemetry_driver({"enabled": True, "span_groups": "default", "namespace": "nemo_gym", "exporter": "dump",
                           "dump_dir": str(tmp_path / "dumps")}, service_name="gym-server")
    with umbrella_span("job", "rl.gym.job"), umbrella_span("rollout", "rl.gym.run_rollouts"):
        pass
    shutdown_telemetry(timeout_s=10)
    ingest([tmp_path / "dumps"], out=tmp_path / "ds")
    spans = read_spans(tmp_path / "ds")
    assert set(spans.column("span_groups_namespace").to_pylist()) == {"nemo_gym"}
    found = missing(check_run(spans))
    assert {g: f["severity"] for (_, g), f in found.items()} == {"server": "info", "http_client": "info"}
    assert "enabled in gym-server rank 0, but" in found[("gym-run", "server")]["message"]
    assert missing(check_with_engine(tmp_path / "ds")) == found
    at = spans.schema.get_field_index("span_groups_namespace")
    older = spans.set_column(at, spans.schema.field(at), pa.nulls(spans.num_rows, spans.schema.field(at).type))
    assert missing(check_run(older)) == {}


def test_presence_read_a_few_rows_at_a_time_is_the_whole_tables(dumps):
    """The partial reads its columns a record batch at a time; batches that cut processes (each
    with a dictionary of its own) give the same report."""
    spans = read_spans(dumps)
    whole = check_run(spans).to_dict()
    def own_dictionary(column: pa.Array) -> pa.Array:
        return pc.dictionary_encode(column.cast(column.type.value_type)) if pa.types.is_dictionary(column.type) \
            else column

    small = pa.Table.from_batches([pa.RecordBatch.from_arrays([own_dictionary(c) for c in batch.columns],
                                                              names=batch.schema.names)
                                   for batch in spans.combine_chunks().to_batches(max_chunksize=4)])
    assert spans.num_rows > 4 * 3 and small.column("service_name").num_chunks > 3
    assert check_run(small).to_dict() == whole

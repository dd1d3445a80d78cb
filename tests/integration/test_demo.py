"""``nemo-telemetry demo``: a real instrumented run (Ray actors, threads, HTTP), read back by the analysis.

Three runs for the whole module (sync, async, async without the collector's carrier), on the
session's Ray cluster. Every assertion is made on what the dump exporter wrote and ingest read
back, so it checks the instrumentation and the analysis together, the way a user meets them.
"""

from __future__ import annotations

import io
import json
import os
import re

import pandas as pd
import pytest
from rich.console import Console
from typer.testing import CliRunner

from _demo_runs import demo_run, spans_frame
from nemo_telemetry.cli.app import app
from nemo_telemetry.demo.actors import FLEET_GPUS, SERVICE_NAMES
from nemo_telemetry.demo.trainer import DemoSettings, fleet_gpus

pytestmark = pytest.mark.slow

STEPS = 4  # validation at 0 and 3, a checkpoint at 3 whose finalize runs into step 4


@pytest.fixture(scope="module")
def sync_run(ray_cluster, tmp_path_factory):
    return demo_run(tmp_path_factory.getbasetemp(), mode="sync", steps=STEPS)


@pytest.fixture(scope="module")
def async_run(ray_cluster, tmp_path_factory):
    return demo_run(tmp_path_factory.getbasetemp(), mode="async", steps=STEPS)


@pytest.fixture(scope="module")
def detached_run(ray_cluster, tmp_path_factory):
    return demo_run(tmp_path_factory.getbasetemp(), mode="async", steps=3, no_carrier=True)


def _one(frame, name):
    rows = frame[frame["name"] == name]
    assert len(rows) == 1, f"expected one {name!r} span, found {len(rows)}"
    return rows.iloc[0]


def _parent_of(frame, row):
    return frame[frame["span_id"] == row["parent_span_id"]].iloc[0]


# -- one trace per run -------------------------------------------------------------------------


@pytest.mark.parametrize("fixture", ["sync_run", "async_run"])
def test_every_process_joins_the_jobs_trace(fixture, request):
    result = request.getfixturevalue(fixture)
    spans = spans_frame(result)
    assert spans["trace_id"].nunique() == 1
    assert spans["run_id"].unique().tolist() == [result.run_id]
    services = set(spans["service_name"])
    expected = {SERVICE_NAMES["driver"], SERVICE_NAMES["policy"], SERVICE_NAMES["generation"]}
    if result.mode == "async":
        expected.add(SERVICE_NAMES["collector"])
    assert expected <= services
    policy_ranks = set(spans.loc[spans["service_name"] == SERVICE_NAMES["policy"], "rank"])
    assert policy_ranks == {0, 1}
    job = _one(spans, "rl.grpo.job")
    assert pd.isna(job["parent_span_id"])
    # every other span hangs off a parent that is in the dataset: nothing re-rooted or orphaned
    assert set(spans.loc[spans["span_id"] != job["span_id"], "parent_span_id"]) <= set(spans["span_id"])


@pytest.mark.parametrize("fixture", ["sync_run", "async_run"])
def test_every_process_declares_its_fleet_and_gpus(fixture, request):
    """Each service is one fleet with the GPUs its workers stand for (the demo runs on CPU)."""
    result = request.getfixturevalue(fixture)
    spans = spans_frame(result)
    resources = spans["resource_attributes"].map(dict)
    declared = {(service, res["rl.fleet"], res["nv.dl.gpu.count"])
                for service, res in zip(spans["service_name"], resources)}
    gpus = fleet_gpus(DemoSettings(mode=result.mode, placement=result.placement))
    assert gpus["generation"] == (2 if result.placement == "colocated" else FLEET_GPUS["generation"])
    expected = {(SERVICE_NAMES["driver"], "driver", "0"),
                (SERVICE_NAMES["policy"], "policy", str(FLEET_GPUS["policy"])),
                (SERVICE_NAMES["generation"], "generation", str(gpus["generation"]))}
    if result.mode == "async":
        expected.add((SERVICE_NAMES["collector"], "collector", str(FLEET_GPUS["collector"])))
    assert declared == expected


def test_worker_spans_nest_under_the_driver_phase_that_called_them(sync_run):
    spans = spans_frame(sync_run)
    for worker_span, driver_span in [("rl.policy.train", "rl.grpo.policy_training"),
                                     ("rl.policy.get_logprobs", "rl.grpo.policy_and_reference_logprobs"),
                                     ("rl.vllm.engine.generate", "rl.vllm.generate"),
                                     ("rl.policy.load_model", "rl.setup.workers")]:
        rows = spans[spans["name"] == worker_span]
        assert len(rows) > 0, worker_span
        parents = {_parent_of(spans, row)["name"] for _, row in rows.iterrows()}
        assert parents == {driver_span}, worker_span


def test_the_reward_http_hop_is_client_then_server_across_the_header(sync_run):
    spans = spans_frame(sync_run)
    servers = spans[(spans["kind"] == "server") & (spans["name"] == "POST /verify")]
    assert len(servers) == STEPS * 4  # one per prompt group and step
    for _, server in servers.iterrows():
        client = _parent_of(spans, server)
        assert client["kind"] == "client"
        assert _parent_of(spans, client)["name"] == "rl.gym.run_rollouts"
        assert server["attributes"]["http.response.status_code"] == "200"


# -- goodput and findings ----------------------------------------------------------------------


@pytest.mark.parametrize("fixture", ["sync_run", "async_run"])
def test_goodput_is_a_share_and_the_default_run_has_no_error_findings(fixture, request):
    result = request.getfixturevalue(fixture)
    total = result.goodput.total
    assert 0 < total["goodput"] < 1
    assert result.goodput.steps.num_rows == STEPS
    assert result.goodput.job_wall_s > total["wall_s"]  # startup and teardown are outside the steps
    errors = [f for f in result.check.findings if f.severity == "error"]
    assert errors == []
    assert result.check.counts["by_code"]["detached-trace"] == 0


def test_async_goodput_has_no_productive_generation_term(sync_run, async_run):
    # Seed 000: async generation overlaps training in the collector, whose batch spans are
    # unbucketed umbrellas, so the driver's productive time is reward + training only.
    sync_steps = sync_run.goodput.steps.to_pandas()
    async_steps = async_run.goodput.steps.to_pandas()
    assert async_run.goodput.total["goodput"] < sync_run.goodput.total["goodput"]
    assert async_steps["wall_s"].median() < sync_steps["wall_s"].median()
    assert async_steps["idle_s"].sum() > 0
    assert sync_steps["idle_s"].sum() == 0


def test_validation_and_checkpoint_shapes(sync_run):
    spans = spans_frame(sync_run)
    evaluate = spans[spans["name"] == "rl.grpo.evaluate"]
    assert sorted(evaluate["rl.iteration"]) == [0, 3]
    generate_in_eval = spans[spans["parent_span_id"].isin(evaluate["span_id"])]
    assert set(generate_in_eval["name"]) == {"rl.vllm.generate"}
    assert set(generate_in_eval["rl.bucket"]) == {"overhead"}  # bucket_scope(OVERHEAD)
    assert set(spans.loc[spans["name"] == "rl.vllm.generate", "rl.bucket"]) == {"overhead", "productive"}
    assert sync_run.goodput.outside_steps["overhead_s"] > 0  # validation at iteration 0

    finalize = _one(spans, "rl.checkpoint.finalize")
    staging = _parent_of(spans, finalize)
    step3 = spans[(spans["name"] == "rl.grpo.step") & (spans["rl.iteration"] == 3)].iloc[0]
    assert staging["name"] == "rl.grpo.checkpointing" and staging["rl.bucket"] == "overhead"
    assert finalize["rl.iteration"] == 3 and pd.isna(finalize["rl.bucket"])
    assert finalize["end_ns"] > step3["end_ns"]  # durable only during step 4
    assert os.path.isdir(sync_run.out / "checkpoints" / "step_3")
    assert sync_run.train.checkpoints == (str(sync_run.out / "checkpoints" / "step_3"),)


def test_async_collector_batches_and_waits(async_run):
    spans = spans_frame(async_run)
    job = _one(spans, "rl.grpo.job")
    collector = spans[spans["service_name"] == SERVICE_NAMES["collector"]]
    batches = collector[collector["name"] == "rl.grpo.generation"]
    assert len(batches) >= STEPS
    assert set(batches["parent_span_id"]) == {job["span_id"]}  # the carrier taken inside the job
    assert batches["rl.bucket"].isna().all()
    assert all("rl.weight_version" in a and "rl.num_prompt_groups" in a for a in batches["attributes"])
    puts = collector[collector["name"] == "rl.data_plane.put"]  # per_prompt_scope: unbucketed
    assert len(puts) == 4 * len(batches) and puts["rl.bucket"].isna().all()
    waits = collector[collector["rl.efficiency.category"].notna()]
    assert set(waits["rl.efficiency.category"]) <= {"idle/refit_event_wait", "idle/generation_limit_pause"}
    assert len(waits) > 0 and waits["rl.bucket"].isna().all()
    bubbles = spans[spans["name"] == "rl.idle.refit_bubble"]
    assert len(bubbles) == STEPS and set(bubbles["rl.bucket"]) == {"idle"}
    assert set(bubbles["service_name"]) == {SERVICE_NAMES["driver"]}


def test_async_steps_carry_their_efficiency_metrics_beside_the_buckets(async_run, sync_run):
    """The driver tees its wait timers as rl.efficiency.seconds each step; goodput shows them per step."""
    steps = async_run.goodput.steps.to_pandas().set_index("iteration")
    bubble = steps["efficiency/idle/refit_bubble_s"]
    assert bubble.notna().all() and (bubble > 0).all()
    # the metric measures the same waits the idle spans cover, on the same driver clock
    spans = spans_frame(async_run)
    bubble_spans = spans[spans["name"] == "rl.idle.refit_bubble"].set_index("rl.iteration")["duration_ns"] / 1e9
    assert (bubble - bubble_spans.reindex(bubble.index)).abs().max() < 0.05
    assert not [c for c in sync_run.goodput.steps.column_names if c.startswith("efficiency/")]


def test_an_async_run_says_what_its_goodput_means_in_json_and_under_the_total(async_run, sync_run):
    """Seed 000: a span-derived ratio on an async run has no productive generation term."""
    (caveat,) = async_run.goodput.caveats
    assert "no productive generation term" in caveat and "generation contributed nothing" in caveat
    assert sync_run.goodput.caveats == ()
    runner = CliRunner()
    for run, expected in ((async_run, [caveat]), (sync_run, [])):
        doc = json.loads(runner.invoke(app, ["goodput", str(run.dataset), "--format", "json"]).stdout)
        assert doc["runs"][0]["caveats"] == expected
    lines = runner.invoke(app, ["goodput", str(async_run.dataset)], env={"COLUMNS": "120"}).output.splitlines()
    total = next(i for i, line in enumerate(lines) if line.strip().startswith("total"))
    first = next(i for i, line in enumerate(lines) if line.startswith("async run:"))
    assert first > total and all(not line.strip() for line in lines[total + 1:first])  # right under the total


def _efficiency_cells(run) -> list[str]:
    """What the efficiency table must show whole: every category's words and every value."""
    from nemo_telemetry.cli.render import MEASUREMENTS, _fmt

    cells = []
    for field in run.steps.schema:
        if field.name.startswith("efficiency/"):
            category = field.name.removeprefix("efficiency/").removesuffix("_s")
            cells += [w for w in re.split(r"[/_]", category) if w]
            measurement = field.metadata[b"rl.efficiency.measurement"].decode()
            cells += MEASUREMENTS[measurement][0].split()
            cells += [_fmt(v) for v in run.steps.column(field.name).to_pylist() if v is not None]
    return cells


def test_the_async_efficiency_table_labels_each_measurement_and_fits_80_columns(async_run):
    from nemo_telemetry.cli.render import bar_width_for, render_run

    cells = _efficiency_cells(async_run.goodput)
    assert "driver" in cells and len(cells) > 8
    buffer = io.StringIO()
    Console(file=buffer, width=80, color_system=None).print(render_run(async_run.goodput, bar_width=bar_width_for(80)))
    result = CliRunner().invoke(app, ["goodput", str(async_run.dataset)], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    for text in (buffer.getvalue(), result.output):
        assert "…" not in text  # nothing cut: no header, value or step column
        assert max(len(line) for line in text.splitlines()) <= 80
        efficiency = text[text.index("efficiency metrics"):]
        assert all(cell in efficiency for cell in cells), [c for c in cells if c not in efficiency]
        assert "driver wall: the driver's wall clock" in " ".join(efficiency.split())  # the legend


# -- --no-carrier breaks it, and the findings say so ------------------------------------------


def test_without_the_carrier_the_collector_is_a_detached_trace(detached_run):
    spans = spans_frame(detached_run)
    job = _one(spans, "rl.grpo.job")
    batches = spans[(spans["service_name"] == SERVICE_NAMES["collector"]) & (spans["name"] == "rl.grpo.generation")]
    assert len(batches) > 0
    assert batches["parent_span_id"].isna().all()
    assert not (batches["trace_id"] == job["trace_id"]).any()
    detached = [f for f in detached_run.check.findings if f.code == "detached-trace"]
    assert detached and all(f.severity == "warning" for f in detached)
    assert set(batches["span_id"]) <= {s for f in detached for s in f.span_ids}
    assert "collector" in detached[0].message
    assert 0 < detached_run.goodput.total["goodput"] < 1  # the driver's steps are intact


# -- the CLI -----------------------------------------------------------------------------------


def test_report_renders_goodput_findings_and_the_step_waterfall(sync_run):
    from nemo_telemetry.cli.demo_cmds import print_demo_report

    buffer = io.StringIO()
    print_demo_report(sync_run, Console(file=buffer, width=160, color_system=None))
    text = buffer.getvalue()
    assert sync_run.run_id in text
    assert "rl.grpo.policy_training" in text and "rl.checkpoint.finalize" in text  # the step-3 waterfall
    assert "goodput" in text.lower()


def test_cli_refuses_a_bad_mode_before_starting_anything(tmp_path):
    result = CliRunner().invoke(app, ["demo", "--mode", "sometimes", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "sometimes" in result.output and "sync, async" in result.output
    assert not (tmp_path / "out").exists()


def test_cli_refuses_an_out_directory_it_did_not_make(tmp_path):
    (tmp_path / "precious.txt").write_text("keep me")
    result = CliRunner().invoke(app, ["demo", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "not empty" in result.output
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_startup_helpers_and_the_data_plane_client_shape_the_demos_spans(sync_run):
    spans = spans_frame(sync_run)
    ray_init = _one(spans, "rl.setup.ray_init")
    assert ray_init["attributes"]["rl.ray.cluster_source"] == "reused_local"  # the session's cluster
    assert _parent_of(spans, ray_init)["name"] == "rl.startup"
    loads = spans[spans["name"].isin(["rl.policy.load_model", "rl.vllm.load_model"])]
    assert len(loads) == 3 and {a["rl.backend"] for a in loads["attributes"]} == {"demo"}
    assert loads["rl.bucket"].isna().all()
    puts = spans[spans["name"] == "rl.data_plane.put"]
    assert len(puts) == STEPS and set(puts["rl.bucket"]) == {"overhead"}
    for attributes in puts["attributes"]:
        assert attributes["rl.data_plane.op"] == "put" and attributes["rl.data_plane.partition"] == "train"
        assert attributes["rl.data_plane.keys"] == "4" and attributes["rl.data_plane.status"] == "ok"

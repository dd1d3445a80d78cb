"""``goodput --by fleet``: hand-computed GPU-seconds per fleet and bucket (sync split, sync
colocated, async), exact to 1 µs; the findings; the same answer streamed out of core.

Every expected number is worked out by hand in the comments beside it from the spans and metric
points each fixture writes down with exact times, never by calling the code under test.
"""

from __future__ import annotations

import itertools

import pyarrow as pa
import pytest

from nemo_telemetry.analysis.engines.choose import goodput_with_engine
from nemo_telemetry.analysis.goodput.partials import stream_goodput
from nemo_telemetry.analysis.goodput.steps import goodput_document, run_goodput
from nemo_telemetry.analysis.ingestion.metrics import metrics_table
from nemo_telemetry.analysis.model.records import spans_table
from nemo_telemetry.analysis.model.schema import EVENTS_SCHEMA, LINKS_SCHEMA
from nemo_telemetry.analysis.model.tables import OtlpTables
from nemo_telemetry.analysis.model.tree import with_id_keys
from nemo_telemetry.analysis.store.dataset import DatasetWriter
from nemo_telemetry.errors import NemoTelemetryError

S = 1_000_000_000  # ns
MS = 1_000_000
T0 = 1_767_225_600 * S  # every time below is T0 + an offset
US = 1e-6  # tolerance: 1 µs (of GPU-seconds)

_ids = itertools.count(1)
TRACE = "ab" * 16


def process(service: str, rank: int, *, fleet: str | None, gpus: int | None, pid: int, **extra) -> dict:
    """A process's resource attributes, as init_telemetry_worker writes them."""
    resource = {"service.name": service, "nemo.run.id": "run-1", "nv.dl.rank": str(rank), "host.name": "node-0",
                "process.pid": str(pid), **{k: str(v) for k, v in extra.items()}}
    if fleet is not None:
        resource["rl.fleet"] = fleet
    if gpus is not None:
        resource["nv.dl.gpu.count"] = str(gpus)
    return resource


def span(proc: dict, name: str, start: int, end: int, *, bucket=None, iteration=None, group=None, status="unset",
         attributes=None) -> dict:
    return {"trace_id": TRACE, "span_id": f"{next(_ids):016x}", "name": name, "start_ns": T0 + start,
            "end_ns": T0 + end, "bucket": bucket, "iteration": iteration, "span_group": group, "status_code": status,
            "attributes": attributes or {}, "resource_attributes": proc}


def points(proc: dict, name: str, values: list[tuple], *, activity: str | None = None, start: int = 0,
           fleet: str | None = None) -> dict:
    """An OTLP/JSON metrics request: one cumulative monotonic sum, its points ``(t, value)`` at
    T0 + t, started at T0 + ``start`` (or ``(t, value, its own start)``: a counter that restarted);
    ``rl.fleet`` on the points: ``fleet``, else the process's."""
    attributes = [{"key": "rl.fleet", "value": {"stringValue": fleet or proc.get("rl.fleet", "")}}]
    if activity is not None:
        attributes.append({"key": "rl.fleet.activity", "value": {"stringValue": activity}})
    resource = [{"key": k, "value": {"stringValue": v}} for k, v in proc.items()]
    return {"resourceMetrics": [{"resource": {"attributes": resource}, "scopeMetrics": [{"metrics": [{
        "name": name, "unit": "s", "sum": {"aggregationTemporality": 2, "isMonotonic": True, "dataPoints": [
            {"startTimeUnixNano": str(T0 + (p[2] if len(p) > 2 else start)), "timeUnixNano": str(T0 + p[0]),
             "asDouble": p[1], "attributes": attributes} for p in values]}}]}]}]}


def fleets(run) -> dict[str, dict]:
    return {row["fleet"]: row for row in run.fleets.fleets.to_pylist()}


def step_fleets(run) -> dict[int, dict[str, dict]]:
    return {i: {row["fleet"]: row for row in table.to_pylist()} for i, table, _ in run.fleets.steps}


def assert_row(row: dict, **expected) -> None:
    for key, value in expected.items():
        if isinstance(value, float):
            assert row[key] == pytest.approx(value, abs=US), key
        else:
            assert row[key] == value, key


# -- sync, split placement ----------------------------------------------------------------------

SPLIT = dict(**{"nv.dl.topology.size.world": 4, "rl.generation.topology.size.world": 2,
                "rl.generation.colocated": "false"})
DRIVER = process("driver", 0, fleet="driver", gpus=0, pid=1, **SPLIT)
POLICY0 = process("policy", 0, fleet="policy", gpus=2, pid=2, **SPLIT)
POLICY1 = process("policy", 1, fleet="policy", gpus=2, pid=3, **SPLIT)
VLLM = process("vllm", 0, fleet="generation", gpus=2, pid=4, **SPLIT)


def split_spans() -> list[dict]:
    return [
        span(DRIVER, "rl.grpo.step", 0, 10 * S, iteration=1),
        span(DRIVER, "rl.vllm.generate", 0, 4 * S, bucket="productive", iteration=1, group="generation"),
        # a retried dispatch (attempt 1) inside the generate: productive wins the overlap
        span(DRIVER, "rl.sc.generate_and_push", 2 * S, 3 * S, iteration=1, group="per_prompt",
             attributes={"rl.rollout.attempt": "1"}),
        span(DRIVER, "rl.grpo.reward_calculation", 4 * S, 5 * S, bucket="overhead", iteration=1, group="reward"),
        span(DRIVER, "rl.grpo.policy_and_reference_logprobs", 5 * S, 6 * S, bucket="overhead", iteration=1,
             group="logprob"),
        span(DRIVER, "rl.grpo.policy_training", 6 * S, 9 * S, bucket="productive", iteration=1,
             group="policy_update"),
        # a worker's own span: on its own fleet (it holds GPUs), whatever its group
        span(POLICY0, "rl.policy.load_model", 8 * S, 9200 * MS, bucket="overhead", group="model_init"),
        # validation: overhead generation (bucket_scope), on the generation fleet
        span(DRIVER, "rl.vllm.generate", 9 * S, 9500 * MS, bucket="overhead", iteration=1, group="generation"),
        # a second retried dispatch, no group recorded: its name puts it on generation
        span(DRIVER, "rl.sc.generate_and_push", 9500 * MS, 9800 * MS, iteration=1,
             attributes={"rl.rollout.attempt": "2"}),
        # a first try is no retry
        span(DRIVER, "rl.sc.generate_and_push", 9800 * MS, 9900 * MS, iteration=1,
             attributes={"rl.rollout.attempt": "0"}),
        # a checkpoint staging that failed: wasted on the training fleet
        span(DRIVER, "rl.grpo.checkpointing", 9600 * MS, 9700 * MS, bucket="overhead", iteration=1,
             group="checkpoint", status="error"),
        span(DRIVER, "rl.grpo.step", 10 * S, 20 * S, iteration=2),
        span(DRIVER, "rl.vllm.generate", 10 * S, 13 * S, bucket="productive", iteration=2, group="generation"),
        span(DRIVER, "rl.grpo.policy_training", 14 * S, 18 * S, bucket="productive", iteration=2,
             group="policy_update"),
        span(POLICY1, "rl.policy.worker", 14 * S, 18 * S),  # unbucketed: present, no busy time
        span(VLLM, "rl.vllm.worker", 0, 20 * S),
        # after the last step: in no window
        span(DRIVER, "rl.vllm.generate", 20 * S, 21 * S, bucket="productive", iteration=3, group="generation"),
    ]


def test_sync_split_fleets_by_hand():
    (run,) = run_goodput(spans_table(split_spans()), by="fleet,step")
    assert run.fleets.windowing == "steps"
    steps = step_fleets(run)
    # step 1, window [0, 10 s]. generation (2 GPUs): productive [0,4] = 4 s; with overhead
    # [9,9.5]: 4.5 s; with wasted ([2,3] under productive, [9.5,9.8]): 4.8 s
    assert_row(steps[1]["generation"], gpus=2, processes=1, source="spans", gpu_seconds=20.0,
               productive_gpu_s=8.0, overhead_gpu_s=1.0, wasted_gpu_s=0.6, idle_gpu_s=10.4, unknown_gpu_s=0.0,
               goodput=0.4)
    # policy (2 + 2 GPUs): productive [6,9] = 3 s; overhead [5,6] and the worker's [8,9.2]: union
    # [5,9.2] = 4.2 s; wasted [9.6,9.7]: 4.3 s. Reward [4,5] runs on the driver: the fleet is idle then
    assert_row(steps[1]["policy"], gpus=4, processes=2, source="spans", gpu_seconds=40.0,
               productive_gpu_s=12.0, overhead_gpu_s=4.8, wasted_gpu_s=0.4, idle_gpu_s=22.8, unknown_gpu_s=0.0,
               goodput=0.3)
    assert_row(steps[1]["driver"], gpus=0, processes=1, source="spans", gpu_seconds=0.0, productive_gpu_s=0.0,
               goodput=None)
    cluster1 = run.fleets.steps[0][2]
    assert_row(cluster1, fleet="cluster", gpus=6, processes=3, gpu_seconds=60.0, productive_gpu_s=20.0,
               overhead_gpu_s=5.8, wasted_gpu_s=1.0, idle_gpu_s=33.2, unknown_gpu_s=0.0, goodput=20 / 60)
    # step 2, [10, 20]: generation [10,13] = 3 s x 2; policy [14,18] = 4 s x 4
    assert_row(steps[2]["generation"], gpu_seconds=20.0, productive_gpu_s=6.0, idle_gpu_s=14.0)
    assert_row(steps[2]["policy"], gpu_seconds=40.0, productive_gpu_s=16.0, idle_gpu_s=24.0)
    whole = fleets(run)
    assert list(whole) == ["generation", "policy", "driver"]  # GPU fleets by word, the driver last
    assert_row(whole["generation"], gpu_seconds=40.0, productive_gpu_s=14.0, overhead_gpu_s=1.0, wasted_gpu_s=0.6,
               idle_gpu_s=24.4, goodput=0.35, tokens_per_s_per_gpu=None)
    assert_row(whole["policy"], gpu_seconds=80.0, productive_gpu_s=28.0, overhead_gpu_s=4.8, wasted_gpu_s=0.4,
               idle_gpu_s=46.8, goodput=0.35)
    assert_row(run.fleets.cluster, gpus=6, gpu_seconds=120.0, productive_gpu_s=42.0, overhead_gpu_s=5.8,
               wasted_gpu_s=1.0, idle_gpu_s=71.2, unknown_gpu_s=0.0, goodput=0.35)
    assert run.fleets.findings == ()  # GPUs as the config says: 4 training, 2 generation


def test_every_gpu_second_is_in_exactly_one_bucket():
    (run,) = run_goodput(spans_table(split_spans()), by="fleet,step")
    tables = [run.fleets.fleets] + [t for _, t, _ in run.fleets.steps]
    for row in (r for t in tables for r in t.to_pylist()):
        buckets = sum(row[k] for k in ("productive_gpu_s", "overhead_gpu_s", "wasted_gpu_s", "idle_gpu_s",
                                       "unknown_gpu_s"))
        assert buckets == pytest.approx(row["gpu_seconds"], abs=US)


def test_by_fleet_leaves_goodput_per_step_as_it_is():
    spans = spans_table(split_spans())
    plain = goodput_document(run_goodput(spans))
    document = goodput_document(run_goodput(spans, by="fleet"))
    assert {k: v for k, v in document["runs"][0].items()
            if k not in ("fleets", "cluster", "fleet_window", "fleet_findings")} == plain["runs"][0]
    assert "fleet_steps" not in document["runs"][0]
    assert len(goodput_document(run_goodput(spans, by="fleet,step"))["runs"][0]["fleet_steps"]) == 2


# -- sync, colocated --------------------------------------------------------------------------

COLOCATED = {"nv.dl.topology.size.world": 4, "rl.generation.topology.size.world": 4, "rl.generation.colocated": "true"}


def colocated_spans(*, world: int = 4) -> list[dict]:
    placement = {**COLOCATED, "nv.dl.topology.size.world": world}
    driver = process("driver", 0, fleet="driver", gpus=0, pid=1, **placement)
    procs = [process("policy", r, fleet="policy", gpus=2, pid=10 + r, **placement) for r in range(2)]
    procs += [process("vllm", r, fleet="generation", gpus=2, pid=20 + r, **placement) for r in range(2)]
    return [
        span(driver, "rl.grpo.step", 0, 10 * S, iteration=1),
        span(driver, "rl.vllm.generate", 0, 4 * S, bucket="productive", iteration=1, group="generation"),
        span(driver, "rl.grpo.policy_and_reference_logprobs", 4 * S, 5 * S, bucket="overhead", iteration=1,
             group="logprob"),
        span(driver, "rl.grpo.policy_training", 5 * S, 9 * S, bucket="productive", iteration=1,
             group="policy_update"),
        *(span(p, "rl.worker", 0, 1 * S) for p in procs),
    ]


def test_sync_colocated_is_one_physical_fleet_split_by_time():
    (run,) = run_goodput(spans_table(colocated_spans()), by="fleet")
    whole = fleets(run)
    assert list(whole) == ["policy+generation", "driver"]
    # 4 GPUs (both sets of processes declare the same 2 + 2 devices), window 10 s: generation
    # [0,4] and training [5,9] productive = 8 s; log-probs [4,5] overhead = 1 s; [9,10] idle
    assert_row(whole["policy+generation"], gpus=4, processes=4, source="spans", gpu_seconds=40.0,
               productive_gpu_s=32.0, overhead_gpu_s=4.0, wasted_gpu_s=0.0, idle_gpu_s=4.0, goodput=0.8)
    assert_row(run.fleets.cluster, gpus=4, processes=4, gpu_seconds=40.0, productive_gpu_s=32.0, goodput=0.8)
    assert run.fleets.findings == ()


def test_topology_mismatch_names_the_config_size():
    (run,) = run_goodput(spans_table(colocated_spans(world=8)), by="fleet")
    (finding,) = run.fleets.findings
    assert finding.code == "fleet-topology-mismatch" and finding.fleet == "policy+generation"
    assert "4 GPU(s)" in finding.message and "nv.dl.topology.size.world says 8" in finding.message
    # split: the generation fleet against rl.generation.topology.size.world (2 GPUs recorded, 3 configured)
    records = [dict(r, resource_attributes={**r["resource_attributes"], "rl.generation.topology.size.world": "3"})
               for r in split_spans()]
    (run,) = run_goodput(spans_table(records), by="fleet")
    (finding,) = run.fleets.findings
    assert finding.code == "fleet-topology-mismatch" and finding.fleet == "generation"
    assert "2 GPU(s)" in finding.message and "rl.generation.topology.size.world says 3" in finding.message


# -- async ------------------------------------------------------------------------------------

ASYNC = {"rl.async": "true", "nv.dl.topology.size.world": 4}
A_DRIVER = process("driver", 0, fleet="driver", gpus=0, pid=1, **ASYNC)
A_POLICY = process("policy", 0, fleet="policy", gpus=4, pid=2, **ASYNC)
A_VLLM0 = process("vllm", 0, fleet="generation", gpus=2, pid=3, **ASYNC)
A_VLLM1 = process("vllm", 1, fleet="generation", gpus=2, pid=4, **ASYNC)
A_COLLECTOR = process("collector", 0, fleet="collector", gpus=0, pid=5, **ASYNC)


def async_spans() -> list[dict]:
    return [
        span(A_DRIVER, "rl.grpo.job", 0, 30 * S),
        span(A_DRIVER, "rl.init.total", 0, 5 * S, group="efficiency"),  # no bucket: the buffer fill
        span(A_DRIVER, "rl.grpo.step", 5 * S, 15 * S, iteration=1),
        span(A_DRIVER, "rl.idle.buffer_starvation", 5 * S, 7 * S, bucket="idle", iteration=1, group="efficiency"),
        span(A_DRIVER, "rl.grpo.policy_training", 7 * S, 14 * S, bucket="productive", iteration=1,
             group="policy_update"),
        span(A_DRIVER, "rl.grpo.step", 15 * S, 28 * S, iteration=2),
        span(A_DRIVER, "rl.grpo.policy_training", 17 * S, 27 * S, bucket="productive", iteration=2,
             group="policy_update"),
        span(A_POLICY, "rl.policy.worker", 0, 1 * S),
        span(A_VLLM0, "rl.vllm.worker", 0, 1 * S),  # unbucketed: the workers are present, their work has no span
        span(A_VLLM1, "rl.vllm.worker", 0, 1 * S),
        span(A_COLLECTOR, "rl.grpo.generation", 0, 30 * S, group="rollout"),  # an umbrella: no bucket
    ]


def async_metrics() -> pa.Table:
    return metrics_table([
        # vllm 0, generate (productive), 2 GPUs: +8 s over [0,10], +6 over [10,20], +9 over [20,30]
        points(A_VLLM0, "rl.fleet.busy.seconds", [(10 * S, 8.0), (20 * S, 14.0), (30 * S, 23.0)], activity="generate"),
        # vllm 1, validation (overhead), 2 GPUs: +4 s over [0,20]
        points(A_VLLM1, "rl.fleet.busy.seconds", [(20 * S, 4.0)], activity="validation"),
        # tokens: +1000 over [0,10], +4000 over [10,30]
        points(A_VLLM0, "rl.vllm.generation_tokens", [(10 * S, 1000.0), (30 * S, 5000.0)]),
    ])


def test_async_fleets_by_hand():
    (run,) = run_goodput(spans_table(async_spans()), by="fleet,step", metrics=async_metrics())
    assert run.fleets.windowing == "job"
    whole = fleets(run)
    assert list(whole) == ["collector", "generation", "policy", "driver"]
    # window: the job [0,30] less rl.init.total [0,5] = [5,30], 25 s. generation, 4 GPUs = 100 GPU-s.
    # productive: 16 GPU-s over [0,10] -> 5/10 inside = 8; 12 over [10,20] all; 18 over [20,30] all = 38
    # overhead: 8 GPU-s over [0,20] -> 15/20 inside = 6; idle = 100 - 44 = 56
    # tokens: 1000 x 5/10 + 4000 = 4500 over 100 GPU-s = 45 per s per GPU
    assert_row(whole["generation"], gpus=4, processes=2, source="busy_metric", gpu_seconds=100.0,
               productive_gpu_s=38.0, overhead_gpu_s=6.0, wasted_gpu_s=0.0, idle_gpu_s=56.0, unknown_gpu_s=0.0,
               goodput=0.38, tokens_per_s_per_gpu=45.0)
    # policy, 4 GPUs: productive [7,14] + [17,27] = 17 s -> 68 of 100; the driver's idle span is its own
    assert_row(whole["policy"], gpus=4, processes=1, source="spans", gpu_seconds=100.0, productive_gpu_s=68.0,
               overhead_gpu_s=0.0, idle_gpu_s=32.0, goodput=0.68, tokens_per_s_per_gpu=None)
    assert_row(whole["collector"], gpus=0, source="none", gpu_seconds=0.0, unknown_gpu_s=0.0)
    assert_row(run.fleets.cluster, gpus=8, processes=3, gpu_seconds=200.0, productive_gpu_s=106.0,
               overhead_gpu_s=6.0, idle_gpu_s=88.0, goodput=0.53)
    steps = step_fleets(run)
    # step 1 [5,15], 10 s, 40 GPU-s: productive 16 x 5/10 + 12 x 5/10 = 14; overhead 8 x 10/20 = 4;
    # tokens 1000 x 5/10 + 4000 x 5/20 = 1500 over 40 GPU-s
    assert_row(steps[1]["generation"], gpu_seconds=40.0, productive_gpu_s=14.0, overhead_gpu_s=4.0, idle_gpu_s=22.0,
               tokens_per_s_per_gpu=37.5)
    assert_row(steps[1]["policy"], gpu_seconds=40.0, productive_gpu_s=28.0, idle_gpu_s=12.0)
    # step 2 [15,28], 13 s, 52 GPU-s: productive 12 x 5/10 + 18 x 8/10 = 20.4; overhead 8 x 5/20 = 2;
    # tokens 4000 x 13/20 = 2600 over 52 GPU-s
    assert_row(steps[2]["generation"], gpu_seconds=52.0, productive_gpu_s=20.4, overhead_gpu_s=2.0,
               idle_gpu_s=29.6, tokens_per_s_per_gpu=50.0)
    assert_row(steps[2]["policy"], gpu_seconds=52.0, productive_gpu_s=40.0, idle_gpu_s=12.0)
    assert run.fleets.findings == ()


def async_retried_spans() -> list[dict]:
    """The async run and one retried dispatch in the collector, [20, 22]."""
    return [*async_spans(), span(A_COLLECTOR, "rl.sc.generate_and_push", 20 * S, 22 * S, group="per_prompt",
                                 attributes={"rl.rollout.attempt": "1"})]


def test_busy_time_under_a_retried_rollout_is_wasted():
    (run,) = run_goodput(spans_table(async_retried_spans()), by="fleet,step", metrics=async_metrics())
    generation = fleets(run)["generation"]
    # the collector holds no GPUs: the retry is the generation fleet's, still measured by its busy
    # metric. vllm 0's 18 GPU-s over [20,30] put 3.6 under [20,22]: wasted, not productive (38 - 3.6);
    # vllm 1's validation ends at 20: none of it moves
    assert_row(generation, source="busy_metric", productive_gpu_s=34.4, overhead_gpu_s=6.0, wasted_gpu_s=3.6,
               idle_gpu_s=56.0)
    assert_row(step_fleets(run)[2]["generation"], productive_gpu_s=16.8, overhead_gpu_s=2.0, wasted_gpu_s=3.6,
               idle_gpu_s=29.6)  # step 2 [15,28]: 20.4 - 3.6 productive


def test_busy_points_count_for_the_fleet_they_name():
    """fleet_busy(activity, fleet=...) names the fleet the work is for; the process's GPUs count."""
    metrics = metrics_table([
        # the policy worker (4 GPUs) lends its GPUs to generation for +5 s over [10,20]
        points(A_POLICY, "rl.fleet.busy.seconds", [(10 * S, 0.0), (20 * S, 5.0)], activity="generation",
               fleet="generation"),
    ])
    (run,) = run_goodput(spans_table(async_spans()), by="fleet", metrics=metrics)
    # 5 s x 4 GPUs = 20 GPU-s, all inside [5,30]; the generation fleet's capacity is its own 4 GPUs x 25 s
    assert_row(fleets(run)["generation"], source="busy_metric", gpus=4, productive_gpu_s=20.0, idle_gpu_s=80.0)
    assert_row(fleets(run)["policy"], source="spans", productive_gpu_s=68.0)


def test_a_busy_counter_that_restarts_counts_from_its_new_start():
    metrics = metrics_table([
        # vllm 0, 2 GPUs: +8 s over [0,10]; the process restarts, its counter at 3 s at 20 s since 15 s:
        # +3 s over [15,20], not -5
        points(A_VLLM0, "rl.fleet.busy.seconds", [(10 * S, 8.0), (20 * S, 3.0, 15 * S)], activity="generate"),
    ])
    (run,) = run_goodput(spans_table(async_spans()), by="fleet", metrics=metrics)
    # window [5,30], 4 GPUs = 100 GPU-s: 16 GPU-s x 5/10 + 6 GPU-s = 14 productive
    assert_row(fleets(run)["generation"], source="busy_metric", productive_gpu_s=14.0, idle_gpu_s=86.0)


def test_busy_time_the_spans_already_hold_adds_nothing():
    """The sync split demo's case: a vLLM engine with generate spans and a busy counter sees one
    batch twice; the metric must not count it again."""
    busy = metrics_table([points(VLLM, "rl.fleet.busy.seconds", [(20 * S, 7.0)], activity="generate")])
    (run,) = run_goodput(spans_table(split_spans()), by="fleet", metrics=busy)
    # generation's spans over [0,20]: [0,4] u [9,9.8] u [10,13] = 7.8 s; the increment, 7 s over
    # [0,20], fits under them: excess 0, so the rows are the spans' alone (validation overhead included)
    assert_row(fleets(run)["generation"], source="spans+busy_metric", productive_gpu_s=14.0, overhead_gpu_s=1.0,
               wasted_gpu_s=0.6, idle_gpu_s=24.4)


def split_both_metrics() -> pa.Table:
    return metrics_table([
        # vllm (2 GPUs), generate, since 0: +4 s over [0,4], +1.5 over [4,10], +6 over [10,20]
        points(VLLM, "rl.fleet.busy.seconds", [(4 * S, 4.0), (10 * S, 5.5), (20 * S, 11.5)], activity="generate"),
        # vllm, validation (overhead), since 0: +0 over [0,10], +4 over [10,20]
        points(VLLM, "rl.fleet.busy.seconds", [(10 * S, 0.0), (20 * S, 4.0)], activity="validation"),
    ])


def test_a_fleet_with_spans_and_the_busy_metric_counts_what_the_spans_miss():
    (run,) = run_goodput(spans_table(split_spans()), by="fleet,step", metrics=split_both_metrics())
    # generation's span intervals (2 GPUs): productive [0,4] u [10,13]; overhead [9,9.5]; wasted
    # [2,3] (under productive) and [9.5,9.8]; span-free: [4,9] u [9.8,10] (5.2 s) and [13,20] (7 s).
    # generate increments, each less the spans' covered time in its interval, the rest spread over the
    # interval's span-free time:
    #   [0,4] +4 s, covered 4 -> 0;  [4,10] +1.5, covered 0.8 -> 0.7 s x 2 = 1.4 GPU-s, in step 1;
    #   [10,20] +6, covered 3 -> 3 s x 2 = 6 GPU-s over [13,20], in step 2
    # validation: [0,10] +0; [10,20] +4, covered 3 -> 1 s x 2 = 2 GPU-s over [13,20], in step 2
    # step 1 [0,10], 20 GPU-s: productive 2 x 4 + 1.4 = 9.4; overhead 2 x 0.5 = 1; wasted 2 x 0.3 = 0.6;
    #   idle 20 - 11 = 9
    # step 2 [10,20], 20 GPU-s: productive 2 x 3 + 6 = 12; overhead 0 + 2 = 2; wasted 0; idle 6
    steps = step_fleets(run)
    assert_row(steps[1]["generation"], source="spans+busy_metric", gpu_seconds=20.0, productive_gpu_s=9.4,
               overhead_gpu_s=1.0, wasted_gpu_s=0.6, idle_gpu_s=9.0)
    assert_row(steps[2]["generation"], source="spans+busy_metric", gpu_seconds=20.0, productive_gpu_s=12.0,
               overhead_gpu_s=2.0, wasted_gpu_s=0.0, idle_gpu_s=6.0)
    # the run: the sum of its steps; goodput 21.4 / 40
    assert_row(fleets(run)["generation"], source="spans+busy_metric", gpu_seconds=40.0, productive_gpu_s=21.4,
               overhead_gpu_s=3.0, wasted_gpu_s=0.6, idle_gpu_s=15.0, unknown_gpu_s=0.0, goodput=0.535)
    assert_row(fleets(run)["policy"], source="spans", productive_gpu_s=28.0)  # no busy metric: as before
    assert run.fleets.findings == ()


def async_refit_spans() -> list[dict]:
    """The async run and a refit on vllm 0, [20, 22]: the generation fleet's one overhead span."""
    return [*async_spans(), span(A_VLLM0, "rl.vllm.refit", 20 * S, 22 * S, bucket="overhead", group="refit")]


def test_an_async_generation_fleet_with_a_refit_span_keeps_its_busy_time():
    """The async demo's case: a few overhead spans (refit) on a fleet whose generation has no span
    must not hide its busy metric."""
    (run,) = run_goodput(spans_table(async_refit_spans()), by="fleet,step", metrics=async_metrics())
    # window [5,30], generation 4 GPUs = 100 GPU-s; the refit [20,22] holds every GPU: overhead 4 x 2 = 8
    # vllm 0 (2 GPUs), generate: [0,10] +8, covered 0 -> 16 GPU-s over [0,10], 5/10 inside = 8;
    #   [10,20] +6, covered 0 -> 12, all inside; [20,30] +9, covered 2 -> 7 s x 2 = 14 over [22,30], all inside
    # vllm 1 (2 GPUs), validation: [0,20] +4, covered 0 -> 8 GPU-s over [0,20], 15/20 inside = 6
    # productive 8 + 12 + 14 = 34; overhead 8 + 6 = 14; idle 100 - 48 = 52
    assert_row(fleets(run)["generation"], source="spans+busy_metric", gpu_seconds=100.0, productive_gpu_s=34.0,
               overhead_gpu_s=14.0, wasted_gpu_s=0.0, idle_gpu_s=52.0, unknown_gpu_s=0.0, goodput=0.34,
               tokens_per_s_per_gpu=45.0)
    steps = step_fleets(run)
    # step 1 [5,15], 40 GPU-s: productive 16 x 5/10 + 12 x 5/10 = 14; overhead 8 x 10/20 = 4; idle 22
    assert_row(steps[1]["generation"], productive_gpu_s=14.0, overhead_gpu_s=4.0, idle_gpu_s=22.0)
    # step 2 [15,28], 52 GPU-s: productive 12 x 5/10 + 14 x 6/8 = 16.5; overhead 8 (refit) + 8 x 5/20 = 10;
    # idle 52 - 26.5 = 25.5
    assert_row(steps[2]["generation"], productive_gpu_s=16.5, overhead_gpu_s=10.0, wasted_gpu_s=0.0,
               idle_gpu_s=25.5)


def test_a_fleet_with_gpus_and_no_signal_is_unknown_never_idle():
    (run,) = run_goodput(spans_table(async_spans()), by="fleet")  # no metrics: generation has no signal
    generation = fleets(run)["generation"]
    assert_row(generation, source="none", gpu_seconds=100.0, unknown_gpu_s=100.0, idle_gpu_s=0.0,
               productive_gpu_s=0.0, goodput=None)
    (finding,) = run.fleets.findings
    assert finding.code == "fleet-no-busy-signal" and finding.fleet == "generation"
    assert "generate_async" in finding.message and "rl.fleet.busy.seconds" in finding.message


def test_busy_beyond_the_gpus_is_overcommitted_and_capped():
    metrics = metrics_table([
        # vllm 0, 2 GPUs: +30 s of busy in 10 s of wall -> 60 GPU-s over [0,10]
        points(A_VLLM0, "rl.fleet.busy.seconds", [(10 * S, 30.0), (30 * S, 30.0)], activity="generate"),
    ])
    (run,) = run_goodput(spans_table(async_spans()), by="fleet", metrics=metrics)
    generation = fleets(run)["generation"]
    # [5,10] holds 30 GPU-s of it; capacity 100: not over on the whole window
    assert_row(generation, productive_gpu_s=30.0, idle_gpu_s=70.0)
    assert run.fleets.findings == ()  # no window holds more than its GPUs
    heavy = metrics_table([points(A_VLLM0, "rl.fleet.busy.seconds", [(10 * S, 60.0)], activity="generate")])
    for by in ("fleet", "fleet,step"):  # the findings look at every window, whatever the table shows
        (run,) = run_goodput(spans_table(async_spans()), by=by, metrics=heavy)
        # 120 GPU-s over [0,10]: 60 inside the run's window [5,30], whose 4 x 25 = 100 GPU-s hold it
        assert_row(fleets(run)["generation"], productive_gpu_s=60.0, idle_gpu_s=40.0)
        # step 1 [5,15], capacity 40: the same 60 GPU-s -> overcommitted, capped: productive 40, idle 0
        if by == "fleet,step":
            assert_row(step_fleets(run)[1]["generation"], productive_gpu_s=40.0, idle_gpu_s=0.0)
        else:
            assert run.fleets.steps == ()
        (finding,) = run.fleets.findings
        assert finding.code == "fleet-overcommitted" and finding.fleet == "generation"
    assert "60 busy GPU-seconds" in finding.message and "40 GPU-seconds" in finding.message


def test_processes_without_fleet_or_gpus_are_findings():
    driver = process("driver", 0, fleet="driver", gpus=0, pid=1)
    records = [
        span(driver, "rl.grpo.step", 0, 10 * S, iteration=1),
        span(driver, "rl.grpo.policy_training", 0, 5 * S, bucket="productive", iteration=1, group="policy_update"),
        span(process("policy", 0, fleet="policy", gpus=None, pid=2), "rl.policy.worker", 0, S),
        span(process("policy", 1, fleet="policy", gpus=2, pid=3), "rl.policy.worker", 0, S),
        span(process("mystery", 0, fleet=None, gpus=1, pid=4), "rl.other", 0, S),
    ]
    (run,) = run_goodput(spans_table(records), by="fleet")
    codes = {f.code: f for f in run.fleets.findings}
    assert set(codes) == {"fleet-unknown", "fleet-gpus-unknown"}
    assert "mystery:0" in codes["fleet-unknown"].message
    assert codes["fleet-gpus-unknown"].fleet == "policy" and "policy:0" in codes["fleet-gpus-unknown"].message
    assert_row(fleets(run)["policy"], gpus=2, processes=2, gpu_seconds=20.0, productive_gpu_s=10.0)


def test_work_on_a_fleet_that_no_process_declares():
    """The driver's generate spans with no generation worker in the data: a generation row with no
    GPUs, and a finding that says its GPUs are unknown; the training fleet as before."""
    (run,) = run_goodput(spans_table([r for r in split_spans() if r["name"] != "rl.vllm.worker"]), by="fleet")
    whole = fleets(run)
    assert_row(whole["generation"], gpus=0, processes=0, source="spans", gpu_seconds=0.0, goodput=None)
    assert_row(whole["policy"], gpus=4, gpu_seconds=80.0, productive_gpu_s=28.0)
    assert_row(run.fleets.cluster, gpus=4, gpu_seconds=80.0, productive_gpu_s=28.0)
    finding, mismatch = run.fleets.findings
    assert (finding.code, finding.fleet) == ("fleet-gpus-unknown", "generation")
    assert "no process declares rl.fleet=generation" in finding.message
    # and the config's 2 generation GPUs against the 0 the data shows: a process is missing
    assert (mismatch.code, mismatch.fleet) == ("fleet-topology-mismatch", "generation")


def test_by_must_be_known():
    with pytest.raises(NemoTelemetryError, match="fleet,step"):
        run_goodput(spans_table(split_spans()), by="fleets")


# -- the same answer out of core --------------------------------------------------------------


def split_spans_and_busy() -> list[dict]:
    """The split run's spans, streamed with :func:`split_both_metrics`."""
    return split_spans()


def write_dataset(root, records: list[dict], *, batch: int = 3, metrics: pa.Table | None = None):
    """The spans as a dataset, ``batch`` spans a file; ``metrics`` its metrics/ table."""
    spans = with_id_keys(spans_table(records))
    writer = DatasetWriter(root)
    for offset in range(0, spans.num_rows, batch):
        writer.write(OtlpTables(spans.slice(offset, batch), EVENTS_SCHEMA.empty_table(), LINKS_SCHEMA.empty_table()))
    if metrics is not None:
        writer.stage_table("metrics/points.parquet", metrics)
    writer.close()
    return root


@pytest.mark.parametrize("by", ["fleet", "fleet,step"])
@pytest.mark.parametrize("fixture", [split_spans, colocated_spans, async_spans, async_retried_spans,
                                     async_refit_spans, split_spans_and_busy])
def test_streamed_in_small_batches_gives_the_in_memory_answer(tmp_path, fixture, by):
    records = fixture()
    metrics = (async_metrics() if fixture in (async_spans, async_retried_spans, async_refit_spans) else
               split_both_metrics() if fixture is split_spans_and_busy else None)
    root = write_dataset(tmp_path / "ds", records, metrics=metrics)
    expected = goodput_document(run_goodput(spans_table(records), by=by, metrics=metrics))
    assert goodput_document(stream_goodput(root, by=by, batch_rows=2)) == expected
    # the engine's choice: in memory, and streamed past a tiny memory budget
    assert goodput_document(goodput_with_engine(root, by=by)) == expected
    assert goodput_document(goodput_with_engine(root, by=by, memory_budget=1)) == expected


def test_one_run_of_two():
    """--run: the fleets of the run asked for, its processes and points only."""
    other = [dict(r, resource_attributes={**r["resource_attributes"], "nemo.run.id": "run-2"}) for r in split_spans()]
    spans = spans_table([*async_spans(), *other])
    (run,) = run_goodput(spans, by="fleet", run_id="run-1", metrics=async_metrics())
    assert run.run_id == "run-1" and run.fleets.windowing == "job"
    assert_row(fleets(run)["generation"], gpus=4, processes=2, productive_gpu_s=38.0)
    (run,) = run_goodput(spans, by="fleet", run_id="run-2", metrics=async_metrics())
    assert run.fleets.windowing == "steps"
    assert_row(fleets(run)["generation"], gpus=2, processes=1, source="spans", productive_gpu_s=14.0)


def test_spans_of_processes_that_declare_no_fleet(tmp_path):
    """Dumps from before fleets were recorded: the fleets the driver's spans name, with no GPUs, an
    empty cluster, and the findings naming the processes and the fleets; the same streamed."""
    records = [dict(r, resource_attributes={k: v for k, v in r["resource_attributes"].items()
                                            if k not in ("rl.fleet", "nv.dl.gpu.count")}) for r in split_spans()]
    (run,) = run_goodput(spans_table(records), by="fleet")
    assert [(r["fleet"], r["gpus"], r["processes"], r["source"]) for r in run.fleets.fleets.to_pylist()] == [
        ("generation", 0, 0, "spans"), ("policy", 0, 0, "spans")]
    assert_row(run.fleets.cluster, gpus=0, processes=0, gpu_seconds=0.0, goodput=None)
    finding, *unplaced = run.fleets.findings
    assert [(f.code, f.fleet) for f in unplaced] == [  # the config still says 2 and 4 GPUs
        ("fleet-gpus-unknown", "generation"), ("fleet-topology-mismatch", "generation"),
        ("fleet-gpus-unknown", "policy"), ("fleet-topology-mismatch", "policy")]
    assert finding.code == "fleet-unknown" and "4 process(es)" in finding.message
    assert "driver:0" in finding.message and "policy:1" in finding.message and "vllm:0" in finding.message
    root = write_dataset(tmp_path / "ds", records)
    assert goodput_document(stream_goodput(root, by="fleet", batch_rows=2)) == goodput_document((run,))

"""The summary counts of ``check`` equal the findings it lists, and its exit codes follow them.

A seeded fuzzer: random finding lists of every code at every severity through :func:`report`, and
random small runs (each with a random mix of what raises findings at error, warning and info)
through ``check_run``, the partitioned check and the ``check`` CLI.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nemo_telemetry.analysis import check_run, spans_table
from nemo_telemetry.analysis.engines.partitioned_check import stream_check
from nemo_telemetry.analysis.findings.report import FINDING_CODES, SEVERITIES, Finding, report
from nemo_telemetry.analysis.model.tables import OtlpTables
from nemo_telemetry.analysis.model.schema import EVENTS_SCHEMA, LINKS_SCHEMA
from nemo_telemetry.analysis.model.tree import with_id_keys
from nemo_telemetry.analysis.store.dataset import DatasetWriter
from nemo_telemetry.cli.app import app

MS = 1_000_000
SEEDS = 16
T0 = 1_700_000_000_000_000_000


def _finding(code: str, severity: str, i: int) -> Finding:
    return Finding(code=code, severity=severity, message=f"{code} {i}", trace_id=None, span_ids=(), iteration=i)


def _listed(findings) -> Counter:
    return Counter(f.severity for f in findings)


def test_the_issue_example_counts_an_info_finding_once():
    counts = report([_finding("missing-group-spans", "info", 0)], {"missing-group-spans": 1}).counts
    assert (counts["error"], counts["warning"], counts["info"]) == (0, 0, 1)
    assert counts["by_code"]["missing-group-spans"] == 1


@pytest.mark.parametrize("seed", range(40))
def test_random_finding_lists_count_what_is_listed_and_what_producers_counted(seed):
    rng = random.Random(seed)
    cap = rng.choice([None, 0, 1, 2, 5])
    totals = {code: {s: rng.choice([0, 0, 1, 2, 7]) for s in SEVERITIES} for code in FINDING_CODES}
    written, bare = [], {}
    for code, per_severity in totals.items():
        found = [s for s, n in per_severity.items() for _ in range(n)]
        rng.shuffle(found)
        shown = found if cap is None else found[:cap]
        written.extend(_finding(code, s, i) for i, s in enumerate(shown))
        bare[code] = len(found)
    rng.shuffle(written)
    counted = report(written, totals).counts
    for severity in SEVERITIES:  # with or without a cap: what the producers counted, at each severity
        assert counted[severity] == sum(t[severity] for t in totals.values())
    assert counted["by_code"] == {code: sum(t.values()) for code, t in totals.items()}
    listed = report(written, totals).findings
    assert [SEVERITIES.index(f.severity) for f in listed] == sorted(SEVERITIES.index(f.severity) for f in listed)
    if cap is None:  # nothing capped: the counts are the findings listed, per-severity or bare counts alike
        for counts in (counted, report(written, bare).counts):
            assert {s: counts[s] for s in SEVERITIES} == {s: _listed(written)[s] for s in SEVERITIES}
            assert counts["by_code"] == {code: sum(1 for f in written if f.code == code) for code in FINDING_CODES}


# -- random runs through the engines and the CLI ------------------------------------------------


def random_run(rng: random.Random) -> tuple[list[dict], set[str]]:
    """A GRPO run of a few steps with a random mix of mistakes; returns its records and the mistakes."""
    mistakes = {m for m in ("checkpoint-gap", "policy-update-missing", "orphan", "unknown-bucket", "clock-overlap",
                            "real-overlap", "unstamped", "slow-step", "short-nested", "nested") if rng.random() < 0.25}
    groups = ["job", "step", "generation", "logprob"]
    groups += ["checkpoint"] * ("checkpoint-gap" in mistakes) + ["policy_update"] * ("policy-update-missing" in mistakes)
    resource = {"nemo.telemetry.span_groups": ",".join(groups)}
    trace = f"{rng.getrandbits(128):032x}"
    records: list[dict] = []

    def add(name, start, end, parent, **fields):
        span_id = f"{len(records) + 1:016x}"
        records.append({"trace_id": fields.pop("trace", trace), "span_id": span_id, "parent_span_id": parent,
                        "name": name, "start_ns": start, "end_ns": end, "run_id": "run-fuzz",
                        "resource_attributes": resource, **fields})
        return span_id

    steps = rng.randint(5, 8)
    job = add("rl.grpo.job", T0, T0 + (steps + 2) * 200 * MS, None)
    slow = rng.randrange(steps) if "slow-step" in mistakes else -1
    at = T0 + 10 * MS
    for i in range(1, steps + 1):
        length = 600 * MS if i - 1 == slow else 100 * MS + rng.randint(0, 2) * MS
        step = add("rl.grpo.step", at, at + length, job, iteration=i)
        mid, tail = at + length // 2, at + length - 20 * MS
        generate = add("rl.vllm.generate", at, mid, step, iteration=i, bucket="productive")
        if i == 5 and "short-nested" in mistakes:  # 0.5 ms under a bucketed span: within the tolerance
            add("rl.vllm.detokenize", at + MS, at + MS + 500_000, generate, bucket="productive")
        if i == 1 and "nested" in mistakes:
            add("rl.vllm.detokenize", at + MS, at + 6 * MS, generate, bucket="productive")
        add("rl.grpo.policy_and_reference_logprobs", mid, tail, step, iteration=i, bucket="overhead")
        if i == 2 and "clock-overlap" in mistakes:  # 0.4 ms overlap: clock granularity
            add("rl.grpo.reward_calculation", tail - 400_000, at + length, step, iteration=i, bucket="overhead")
        elif i == 3 and "real-overlap" in mistakes:
            add("rl.grpo.reward_calculation", tail - 10 * MS, at + length, step, iteration=i, bucket="overhead")
        else:
            add("rl.grpo.reward_calculation", tail, at + length, step, iteration=i, bucket="overhead")
        if i == 4 and "unknown-bucket" in mistakes:
            add("rl.grpo.reward_calculation", at, at + MS, step, iteration=i, bucket="bogus")
        if i == 1 and "orphan" in mistakes:
            add("rl.grpo.reward_calculation", at, at + MS, f"{0xdead:016x}")
        at += length + 100 * MS
    if "unstamped" in mistakes:
        add("rl.grpo.reward_calculation", at, at + 5 * MS, job, bucket="overhead")
    return records, mistakes


def write_dataset(records: list[dict], root: Path, per_file: int = 7) -> Path:
    spans = with_id_keys(spans_table(records))
    writer = DatasetWriter(root)
    for offset in range(0, spans.num_rows, per_file):
        writer.write(OtlpTables(spans.slice(offset, per_file), EVENTS_SCHEMA.empty_table(),
                                LINKS_SCHEMA.empty_table()))
        writer.commit()
    writer.close()
    return root


@pytest.mark.parametrize("seed", range(SEEDS))
def test_random_runs_count_what_check_lists_on_each_engine_and_the_cli_exits_by_it(seed, tmp_path):
    rng = random.Random(1000 + seed)
    records, mistakes = random_run(rng)
    full = check_run(spans_table(records))
    listed = _listed(full.findings)
    assert {s: full.counts[s] for s in SEVERITIES} == {s: listed[s] for s in SEVERITIES}, mistakes
    assert full.counts["by_code"] == {code: sum(f.code == code for f in full.findings) for code in FINDING_CODES}
    capped = check_run(spans_table(records), max_findings_per_code=1)
    assert capped.counts == full.counts  # past the cap, each finding still counts at its severity
    dataset = write_dataset(records, tmp_path / "ds")
    assert stream_check(dataset).to_dict() == check_run(with_id_keys(spans_table(records))).to_dict()

    runner = CliRunner()
    for fail_on, worse in (("error", ("error",)), ("warning", ("error", "warning")), ("never", ())):
        result = runner.invoke(app, ["check", str(dataset), "--format", "json", "--fail-on", fail_on])
        doc = json.loads(result.stdout)
        shown = Counter(f["severity"] for f in doc["findings"])
        assert {s: doc["counts"][s] for s in SEVERITIES} == {s: shown[s] for s in SEVERITIES}
        assert result.exit_code == (1 if any(shown[s] for s in worse) else 0), (fail_on, mistakes, shown)


def test_the_fuzzer_reaches_every_severity_alone():
    """The runs above cover an info-only run (exit 0 on --fail-on warning), a warning-only run and
    one with errors: the exit codes are tested on each kind."""
    kinds = set()
    for seed in range(SEEDS):
        records, _ = random_run(random.Random(1000 + seed))
        worst = {f.severity for f in check_run(spans_table(records)).findings}
        kinds.add(min(worst, key=SEVERITIES.index) if worst else "none")
    assert {"error", "warning", "info"} <= kinds

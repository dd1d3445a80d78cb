"""``ingest --max-request-mib`` on both engines (the suite's one Ray cluster): a line over a small bound,
in a spans dump and in a metrics dump, is rejected and named identically by the local engine and by
the Ray decode tasks, and everything else is kept the same."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from nemo_telemetry.analysis.synthetic import synthetic_requests
from nemo_telemetry.cli.app import app

BOUND_MIB = 0.01  # 10,485 bytes: a request of 20 spans fits, one of 400 does not


def _dumps(folder: Path) -> tuple[Path, int]:
    folder.mkdir()
    small = list(synthetic_requests(400, spans_per_request=20, seed=3))
    large = list(synthetic_requests(400, spans_per_request=400, seed=4))  # one line of about 40 KB
    lines = [json.dumps(r) for r in small[:10]] + [json.dumps(large[0])] + [json.dumps(r) for r in small[10:]]
    (folder / "traces-1.jsonl").write_text("\n".join(lines) + "\n")
    point = {"timeUnixNano": "1000", "asDouble": 1.0}
    metric = {"resourceMetrics": [{"scopeMetrics": [{"metrics": [{"name": "m", "gauge": {"dataPoints": [point]}}]}]}]}
    wide = {"resourceMetrics": [{"scopeMetrics": [{"metrics": [
        {"name": "m", "gauge": {"dataPoints": [point] * 400}}]}]}]}
    (folder / "metrics-1.jsonl").write_text("\n".join(json.dumps(m) for m in (metric, wide, metric)) + "\n")
    return folder, sum(len(s["spans"]) for r in small for rs in r["resourceSpans"] for s in rs["scopeSpans"])


def test_both_engines_reject_and_name_a_line_over_the_bound_alike(ray_cluster, tmp_path):
    dumps, kept_spans = _dumps(tmp_path / "dumps")
    summaries = {}
    for engine in ("local", "ray"):
        result = CliRunner().invoke(app, ["ingest", str(dumps), "--out", str(tmp_path / engine), "--engine", engine,
                                          "--max-request-mib", str(BOUND_MIB), "--json"])
        assert result.exit_code == 0, result.output
        summaries[engine] = json.loads(result.stdout)
    local, ray = summaries["local"], summaries["ray"]
    assert ray == local
    bound = int(BOUND_MIB * (1 << 20))
    over = [w for w in local["warnings"] if f"longer than {bound} bytes" in w]
    assert sorted(w.split(": line longer")[0] for w in over) == [f"{dumps / 'metrics-1.jsonl'}:2",
                                                                 f"{dumps / 'traces-1.jsonl'}:11"]
    assert local["spans"] == kept_spans >= 400 and local["metric_points"] == 2 and local["rejected_records"] == 2

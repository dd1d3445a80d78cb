"""Hand-built traces for the goodput and findings tests: spans written down in seconds."""

from __future__ import annotations

import pyarrow as pa

from nemo_telemetry.analysis import spans_table

S = 1_000_000_000


class Trace:
    """Spans written down as (name, start s, end s, parent); ids are numbered in order."""

    def __init__(self, trace: str = "a" * 32, run: str = "run-1") -> None:
        self.trace, self.run, self.records = trace, run, []

    def span(self, name: str, start: float, end: float, parent: str | None = None, **fields) -> str:
        span_id = f"{len(self.records) + 1:016x}"
        self.records.append({"trace_id": fields.pop("trace", self.trace), "span_id": span_id,
                             "parent_span_id": parent, "name": name, "start_ns": round(start * S),
                             "end_ns": round(end * S), "run_id": fields.pop("run", self.run), **fields})
        return span_id

    def table(self) -> pa.Table:
        return spans_table(self.records)

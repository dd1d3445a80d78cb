"""The three tables one batch of spans is handed on as, from a decoder to the dataset writer.

They live beside the schema, below both ingestion (which builds them) and the store (which writes
and deduplicates them), so that neither layer reaches into the other for its input type.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nemo_telemetry.analysis.model.schema import EVENTS_SCHEMA, ID_KEY_FIELDS, LINKS_SCHEMA, SPANS_SCHEMA

__all__ = ["SPANS_TABLE_SCHEMA", "OtlpTables"]

# What ingest writes: the spans table plus the uint64 id keys tree walks join on.
SPANS_TABLE_SCHEMA = pa.schema(list(SPANS_SCHEMA) + list(ID_KEY_FIELDS))


@dataclass(frozen=True)
class OtlpTables:
    """The three tables of one batch (or one whole input).

    ``span_words``: each span's (trace id high, trace id low, span id) as uint64 words, when
    the decoder read the ids as bytes; the deduplicator then need not parse the hex again.
    """

    spans: pa.Table
    events: pa.Table
    links: pa.Table
    span_words: np.ndarray | None = field(default=None, compare=False)

    @staticmethod
    def empty() -> "OtlpTables":
        return OtlpTables(
            SPANS_TABLE_SCHEMA.empty_table(), EVENTS_SCHEMA.empty_table(), LINKS_SCHEMA.empty_table()
        )

    @staticmethod
    def concat(parts: list["OtlpTables"]) -> "OtlpTables":
        if not parts:
            return OtlpTables.empty()
        if len(parts) == 1:  # a batch of one part: nothing to join (its words are not copied)
            return parts[0]
        words = [p.span_words for p in parts if p.spans.num_rows]
        return OtlpTables(
            pa.concat_tables([p.spans for p in parts]),
            pa.concat_tables([p.events for p in parts]),
            pa.concat_tables([p.links for p in parts]),
            np.concatenate(words) if words and all(w is not None for w in words) else None,
        )

    def keep_spans(self, mask: np.ndarray) -> "OtlpTables":
        """Only the spans ``mask`` marks, with their events and links (matched on trace and span id)."""
        if mask.all():
            return self
        spans = self.spans.filter(pa.array(mask))
        words = self.span_words[mask] if self.span_words is not None else None
        return OtlpTables(spans, _owned_by(self.events, spans), _owned_by(self.links, spans), words)


def _owned_by(table: pa.Table, spans: pa.Table) -> pa.Table:
    """Rows of an events/links table whose span is in ``spans``."""
    if table.num_rows == 0:
        return table
    owners = pc.binary_join_element_wise(spans.column("trace_id"), spans.column("span_id"), "/")
    keys = pc.binary_join_element_wise(table.column("trace_id"), table.column("span_id"), "/")
    return table.filter(pc.is_in(keys, value_set=owners.combine_chunks()))



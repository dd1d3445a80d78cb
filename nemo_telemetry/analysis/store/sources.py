"""What a SOURCE names: a dataset directory (from ``ingest``), or OTLP dump files and folders of them.

Every reader asks this one module, so a path means the same thing to ``goodput``, ``check``,
``waterfall``, the metrics and the logs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Union

from nemo_telemetry.analysis.store.dataset import is_dataset

__all__ = ["Source", "source_items", "split_sources", "single_dataset"]

Source = Union[str, Path, Iterable[Union[str, Path]]]


def source_items(source: Source) -> list[Path]:
    """The inputs ``source`` names, in the order given (one path, or each of an iterable)."""
    return [Path(source)] if isinstance(source, (str, Path)) else [Path(item) for item in source]


def split_sources(source: Source) -> tuple[list[Path], list[Path]]:
    """(the dataset directories, everything else: dump files and folders of them), each in order."""
    items = source_items(source)
    return [i for i in items if is_dataset(i)], [i for i in items if not is_dataset(i)]


def single_dataset(source: Source) -> Path | None:
    """The dataset directory when ``source`` is exactly one (what the partitioned engines read), else None."""
    items = source_items(source)
    return items[0] if len(items) == 1 and is_dataset(items[0]) else None

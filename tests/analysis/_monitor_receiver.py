"""``monitor --port`` run in a thread for a test: the receiver's URLs once it listens, and its
summary once the test's block ends."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

from nemo_telemetry.analysis import run_monitor


@contextmanager
def monitor_receiver(out, **options) -> Iterator[tuple[dict, list]]:
    """Yields (the URLs ``on_ready`` gave, a list that holds the run's summary after the block);
    the receiver is stopped and joined when the block ends, whether it passed or not."""
    ready, stop = threading.Event(), threading.Event()
    where: dict = {}
    summaries: list = []

    def on_ready(urls: dict) -> None:
        where.update(urls)
        ready.set()

    thread = threading.Thread(target=lambda: summaries.append(
        run_monitor(port=0, out=out, on_ready=on_ready, stop=stop, poll_s=0.05, **options)))
    thread.start()
    try:
        assert ready.wait(60)
        yield where, summaries
    finally:
        stop.set()
        thread.join(60)

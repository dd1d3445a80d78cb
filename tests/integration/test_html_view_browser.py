"""The HTML waterfall in a real headless Chromium (Debian's ``chromium``, driven by playwright)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from nemo_telemetry.analysis import SPANS_SCHEMA, spans_table, to_html

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
EVIL_NAME = "<img src=x onerror=alert(1)>"
EVIL_VALUE = "</script><script>alert(2)</script>"
S = 1_000_000_000
TRACE = "a" * 32


def span(sid: int, name: str, start: float, end: float, parent: int | None = None, **extra) -> dict:
    return {"trace_id": extra.pop("trace_id", TRACE), "span_id": f"{sid:016x}",
            "parent_span_id": None if parent is None else f"{parent:016x}", "name": name,
            "start_ns": int(start * S), "end_ns": int(end * S), **extra}


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium package (`make browser` does it as root)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 800})
    page = context.new_page()
    page.dialogs, page.errors = [], []
    page.on("dialog", lambda dialog: (page.dialogs.append(dialog.message), dialog.dismiss()))
    page.on("pageerror", lambda error: page.errors.append(str(error)))
    page.on("request", lambda request: None if request.url.startswith("file:") else page.errors.append(request.url))
    yield page
    context.close()
    assert page.errors == [], "script errors or network requests"


@pytest.fixture(scope="module")
def fixture_file(tmp_path_factory) -> Path:
    records = [
        span(1, "rl.grpo.job", 0, 100),
        span(2, "rl.grpo.step", 1, 50, 1, iteration=1),
        span(3, "rl.vllm.generate", 2, 30, 2, iteration=1, bucket="productive",
             attributes={"rl.weight_version": "4", "evil": EVIL_VALUE}),
        span(4, "rl.grpo.policy_training", 30, 47, 2, iteration=1, bucket="productive"),
        span(5, "rl.grpo.checkpointing", 47, 49, 2, iteration=1, bucket="overhead"),
        span(6, "rl.checkpoint.finalize", 48, 70, 5, iteration=1),
        span(7, "rl.grpo.step", 51, 95, 1, iteration=2),
        span(8, EVIL_NAME, 52, 60, 7, iteration=2, bucket="wasted"),
        span(9, "rl.idle.buffer_starvation", 60, 94, 7, iteration=2, bucket="idle"),
        span(10, "rl.vllm.generate", 80, 81, 0xDEAD, iteration=2),
    ]
    path = tmp_path_factory.mktemp("html") / "waterfall.html"
    path.write_text(to_html(spans_table(records)), encoding="utf-8")
    return path


def shown_names(page) -> list[str]:
    """Names of the rows drawn, top to bottom."""
    return page.evaluate(
        """() => [...document.querySelectorAll('.row')].filter(r => r.style.display !== 'none')
                 .sort((a, b) => parseFloat(a.style.top) - parseFloat(b.style.top))
                 .map(r => r.querySelector('.name').textContent)""")


def row_for(page, name: str):
    return page.locator(".row", has=page.locator(".name", has_text=name)).first


def test_the_page_shows_the_spans_in_tree_order_and_marks_the_critical_path(page, fixture_file, tmp_path):
    page.goto(fixture_file.as_uri())

    assert shown_names(page) == ["rl.grpo.job", "rl.grpo.step", "rl.vllm.generate", "rl.grpo.policy_training",
                                 "rl.grpo.checkpointing", "rl.checkpoint.finalize", "rl.grpo.step", EVIL_NAME,
                                 "rl.idle.buffer_starvation", "rl.vllm.generate"]
    critical = page.eval_on_selector_all(".row.critical .name", "els => els.map(e => e.textContent)")
    assert critical == ["rl.grpo.step", "rl.grpo.checkpointing", "rl.grpo.step", "rl.idle.buffer_starvation"]
    assert row_for(page, "rl.idle.buffer_starvation").locator(".bar").get_attribute("class") == "bar b-idle"
    assert row_for(page, "rl.grpo.policy_training").locator(".bar").get_attribute("class") == "bar b-productive"
    assert page.locator(".orphan-tag", has_text="orphan").count() == 1
    screenshot = tmp_path / "waterfall.png"
    page.screenshot(path=str(screenshot))
    assert screenshot.stat().st_size > 10_000
    print(f"screenshot: {screenshot}")


def test_a_span_name_that_is_markup_renders_as_text(page, fixture_file):
    page.goto(fixture_file.as_uri())

    assert row_for(page, "onerror").locator(".name").text_content() == EVIL_NAME
    assert page.locator("img").count() == 0
    row_for(page, "rl.vllm.generate").hover()
    tooltip = page.locator("#tooltip")
    assert EVIL_VALUE in tooltip.text_content() and "rl.weight_version" in tooltip.text_content()
    assert page.locator("#tooltip script").count() == 0
    page.wait_for_timeout(50)
    assert page.dialogs == []


def test_collapsing_and_expanding_a_node(page, fixture_file):
    page.goto(fixture_file.as_uri())
    step_one = page.locator(".row", has=page.locator(".name", has_text="rl.grpo.step")).first

    step_one.locator(".toggle").click()
    assert "rl.vllm.generate" not in shown_names(page)[:3]
    assert shown_names(page)[:3] == ["rl.grpo.job", "rl.grpo.step", "rl.grpo.step"]
    assert step_one.locator(".count-tag").text_content() == "+4"

    step_one.locator(".toggle").click()
    assert shown_names(page)[2] == "rl.vllm.generate"

    page.click("#collapse-all")
    assert shown_names(page) == ["rl.grpo.job", "rl.vllm.generate"]
    row_for(page, "rl.grpo.job").locator(".toggle").click()
    assert shown_names(page) == ["rl.grpo.job", "rl.grpo.step", "rl.grpo.step", "rl.vllm.generate"]


def test_search_filters_to_matches_and_their_ancestors(page, fixture_file):
    page.goto(fixture_file.as_uri())

    page.fill("#search", "FINALIZE")
    page.wait_for_function("() => window.__waterfall.visibleCount() === 4")
    assert shown_names(page) == ["rl.grpo.job", "rl.grpo.step", "rl.grpo.checkpointing", "rl.checkpoint.finalize"]
    assert page.eval_on_selector_all(".row.match .name", "els => els.map(e => e.textContent)") == [
        "rl.checkpoint.finalize"]

    page.fill("#search", "")
    page.wait_for_function("() => window.__waterfall.visibleCount() === 10")


def test_zoom_and_pan_change_the_time_window(page, fixture_file):
    page.goto(fixture_file.as_uri())
    training_bar = row_for(page, "rl.grpo.policy_training").locator(".bar")
    full_width = training_bar.bounding_box()["width"]

    page.click("#zoom-in")
    assert page.evaluate("window.__waterfall.view()") == [25_000_000, 75_000_000]  # µs
    assert training_bar.bounding_box()["width"] == pytest.approx(2 * full_width, rel=0.02)
    page.click("#pan-right")
    assert page.evaluate("window.__waterfall.view()") == [37_500_000, 87_500_000]
    row_for(page, "rl.grpo.checkpointing").dblclick()
    view = page.evaluate("window.__waterfall.view()")
    assert view[0] < 47_000_000 < 49_000_000 < view[1] and view[1] - view[0] < 3_000_000
    page.click("#reset")
    assert page.evaluate("window.__waterfall.view()") == [0, 100_000_000]


def big_run(steps: int, prompts: int) -> pa.Table:
    """A job with ``steps`` steps, each with a generation span over ``prompts`` rollouts."""
    per_step = prompts + 2
    n = 1 + steps * per_step
    idx = np.arange(n)
    step_of = np.maximum(idx - 1, 0) // per_step
    within = np.maximum(idx - 1, 0) % per_step
    step_row = 1 + step_of * per_step
    parent = np.where(idx == 0, -1, np.where(within == 0, 0, np.where(within == 1, step_row, step_row + 1)))
    step_start = step_of * 10 * S
    start = np.where(idx == 0, 0, step_start + np.where(within < 2, 0, (within - 2) * (8 * S // prompts)))
    end = np.where(idx == 0, steps * 10 * S, np.where(within == 0, step_start + 9 * S,
                                                       np.where(within == 1, step_start + 8 * S, start + S)))
    names = np.where(idx == 0, "rl.grpo.job", np.where(within == 0, "rl.grpo.step",
                                                       np.where(within == 1, "rl.grpo.generation", "rl.gym.run_rollouts")))
    # Span ids are random 64-bit numbers in real traces; spread these the same way.
    with np.errstate(over="ignore"):
        keys = (idx.astype(np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
    hex_ids = np.array([f"{k:016x}" for k in keys.tolist()])
    columns = {
        "trace_id": pa.array([TRACE] * n), "span_id": pa.array(hex_ids),
        "parent_span_id": pa.array(np.where(parent >= 0, hex_ids[np.maximum(parent, 0)], None)),
        "name": pa.array(names), "kind": pa.array(["internal"] * n), "start_ns": pa.array(start),
        "end_ns": pa.array(end), "duration_ns": pa.array(end - start), "status_code": pa.array(["unset"] * n),
        "service_name": pa.array(["driver"] * n), "run_id": pa.array(["run-big"] * n), "rank": pa.array(np.zeros(n, np.int64)),
        "rl.bucket": pa.array(np.where(within >= 2, "productive", None)),
        "rl.iteration": pa.array(np.where((within == 0) & (idx > 0), step_of, None)),
    }
    empty = {f.name: pa.nulls(n, f.type) for f in SPANS_SCHEMA if f.name not in columns}
    table = pa.table({**columns, **empty})
    return table.select(SPANS_SCHEMA.names).cast(SPANS_SCHEMA)


def test_a_100000_span_run_opens_quickly_and_draws_only_visible_rows(page, tmp_path):
    table = big_run(steps=50, prompts=1998)
    assert table.num_rows == 100_001
    path = tmp_path / "big.html"
    path.write_text(to_html(table), encoding="utf-8")

    started = time.perf_counter()
    page.goto(path.as_uri())
    page.wait_for_selector(".row")
    load_s = time.perf_counter() - started

    assert page.evaluate("window.__waterfall.rows") == 100_001
    assert shown_names(page)[:3] == ["rl.grpo.job", "rl.grpo.step", "rl.grpo.step"]
    assert page.locator(".row").count() < 100  # virtualized: only rows in view exist
    page.click("#expand-all")
    assert page.evaluate("window.__waterfall.visibleCount()") == 100_001
    page.evaluate("document.getElementById('viewport').scrollTop = 1e9")
    page.wait_for_timeout(100)
    assert page.locator(".row").count() < 100
    assert shown_names(page)[-1] == "rl.gym.run_rollouts"
    page.fill("#search", "generation")
    page.wait_for_function("() => window.__waterfall.visibleCount() === 101")
    print(f"100,001-span page: loaded in {load_s:.2f} s")  # figures go in the report, not asserts
    assert load_s < 30, "the page froze"


def test_a_spans_log_records_show_in_its_tooltip_as_text(page, tmp_path):
    from nemo_telemetry.analysis import LOGS_SCHEMA

    spans = spans_table([span(1, "rl.grpo.step", 0, 10, iteration=1),
                         span(2, "rl.grpo.generation", 1, 9, 1, iteration=1, bucket="productive")])
    logs = pa.Table.from_pylist([
        {"trace_id": TRACE, "span_id": f"{2:016x}", "time_ns": 2 * S, "severity": "WARN", "body": EVIL_VALUE},
        {"trace_id": TRACE, "span_id": f"{2:016x}", "time_ns": 3 * S, "severity": "INFO", "body": EVIL_NAME},
        {"trace_id": TRACE, "span_id": None, "time_ns": 4 * S, "severity": "INFO", "body": "in no span"},
    ], schema=LOGS_SCHEMA)
    path = tmp_path / "logs.html"
    path.write_text(to_html(spans, logs=logs), encoding="utf-8")
    page.goto(path.as_uri())

    row = row_for(page, "rl.grpo.generation")
    assert row.locator(".log-tag").text_content() == "2 logs"
    assert row_for(page, "rl.grpo.step").locator(".log-tag").text_content() == ""
    row.hover()
    lines = page.locator("#tooltip .log").all_text_contents()
    assert lines == [f"+1.00s WARN {EVIL_VALUE}", f"+2.00s INFO {EVIL_NAME}"]
    assert page.locator("#tooltip img").count() == 0 and page.locator("#tooltip script").count() == 0
    page.wait_for_timeout(50)
    assert page.dialogs == []

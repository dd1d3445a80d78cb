"""The HTML export as a file: self-contained, and span data can never become markup."""

from __future__ import annotations

import json
import re

from nemo_telemetry.analysis import spans_table, to_html

S = 1_000_000_000
EVIL_NAME = "<img src=x onerror=alert(1)>"
EVIL_VALUE = "</script><!-- <script>alert(2)</script> & \u2028"
DATA_BLOCK = re.compile(r'<script type="application/json" id="waterfall-data">(.*?)</script>', re.S)


def page() -> str:
    records = [
        {"trace_id": "a" * 32, "span_id": "1" * 16, "name": "rl.grpo.step", "start_ns": 0, "end_ns": 10 * S,
         "iteration": 1},
        {"trace_id": "a" * 32, "span_id": "2" * 16, "parent_span_id": "1" * 16, "name": EVIL_NAME,
         "start_ns": S, "end_ns": 2 * S, "attributes": {"evil": EVIL_VALUE}, "service_name": EVIL_NAME},
    ]
    return to_html(spans_table(records), title=EVIL_NAME)


def test_span_data_sits_in_one_json_block_that_no_name_can_close():
    text = page()

    (block,) = DATA_BLOCK.findall(text)
    assert "<" not in block and ">" not in block and "&" not in block
    data = json.loads(block)
    assert data["names"] == ["rl.grpo.step", EVIL_NAME]
    assert ["evil", EVIL_VALUE] in data["attrs"][1]
    assert data["rows"]["c"] == [1, 1]  # the step and its last-ending child: the critical path


def test_the_page_needs_no_network_and_escapes_its_title():
    text = page()
    outside_data = DATA_BLOCK.sub("", text)

    assert not re.search(r"<[^>]*\s(src|href)\s*=", outside_data)  # no tag loads anything
    assert "http://" not in outside_data and "https://" not in outside_data
    assert "<title>&lt;img src=x onerror=alert(1)&gt;</title>" in text
    assert "default-src 'none'" in text  # the browser refuses any fetch the page might attempt

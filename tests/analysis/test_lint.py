"""lint: each violation in a fixture tree is found at its line, a clean tree gives nothing.

The violations fixture marks every offending line with a trailing ``# <code>`` comment, so the
expected findings are read from the fixture itself rather than repeated here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nemo_telemetry.analysis.lint import LINT_CODES, LintError, LintFinding, lint_paths, lint_source
from nemo_telemetry.cli.app import app

FIXTURES = Path(__file__).parent.parent / "fixtures" / "lint"
VIOLATIONS = FIXTURES / "violations"
CLEAN = FIXTURES / "clean"

runner = CliRunner()


def _marked_lines(root: Path) -> set[tuple[str, int, str]]:
    marked = set()
    for path in sorted(root.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            match = re.search(r"#\s*([a-z]+(?:-[a-z]+)+)\s*$", line)
            if match and match.group(1) in LINT_CODES:
                marked.add((str(path), number, match.group(1)))
    return marked


def test_every_marked_violation_is_found_and_nothing_else():
    findings = lint_paths([VIOLATIONS])
    found = {(f.file, f.line, f.code) for f in findings}
    expected = _marked_lines(VIOLATIONS) | {
        # Scorer.score is never dispatched at all: reported at its definition
        (str(VIOLATIONS / "pkg" / "actors.py"), 14, "undispatched-carrier"),
    }
    assert found == expected
    assert {f.code for f in findings} == set(LINT_CODES)  # the fixture exercises every code


def test_clean_tree_has_no_findings():
    assert lint_paths([CLEAN]) == []


def test_findings_are_sorted_frozen_and_render_as_file_line_code_message():
    findings = lint_paths([VIOLATIONS])
    assert findings == sorted(findings)
    first = findings[0]
    assert isinstance(first, LintFinding)
    with pytest.raises(AttributeError):
        first.line = 0  # type: ignore[misc]
    assert str(first) == f"{first.file}:{first.line}: {first.code}: {first.message}"


def test_a_decorated_method_dispatched_in_another_file_is_not_reported():
    actors = CLEAN / "pkg" / "actors.py"
    alone = lint_paths([actors])  # the dispatching trainer is not part of the tree
    assert {f.code for f in alone} == {"undispatched-carrier"}
    assert lint_paths([actors, CLEAN / "pkg" / "trainer.py"]) == []


def test_messages_name_the_fix():
    messages: dict[str, list[str]] = {}
    for finding in lint_paths([VIOLATIONS]):
        messages.setdefault(finding.code, []).append(finding.message)
    assert any("use umbrella_span(RLSpanGroup.U_ROLLOUT, ...)" in m for m in messages["leaf-on-umbrella"])
    assert any("use umbrella_trace_fn(RLSpanGroup.U_JOB, ...)" in m for m in messages["leaf-on-umbrella"])
    assert any("use managed_span(RLSpanGroup.GENERATION, ...)" in m for m in messages["umbrella-on-leaf"])
    assert any("as RLSpanGroup.U_STEP" in m for m in messages["umbrella-alias"])
    assert any("dispatch_with_trace_context(collector.run, ...)" in m for m in messages["undispatched-carrier"])


@pytest.mark.parametrize(
    ("line", "code"),
    [
        ("with managed_span(RLSpanGroup.U_STEP, 'x'): pass", "leaf-on-umbrella"),
        ("with managed_span(GymSpanGroup.SERVER, 'x'): pass", "leaf-on-umbrella"),
        ("with umbrella_span('checkpoint', 'x'): pass", "umbrella-on-leaf"),
        ("with umbrella_span(RLSpanGroup.PER_PROMPT, 'x'): pass", "umbrella-alias"),
        ("with umbrella_span(GymSpanGroup.ROLLOUT, 'x'): pass", "umbrella-alias"),
        ("with primitives.umbrella_span(RLSpanGroup.EVALUATE, 'x'): pass", "umbrella-alias"),
    ],
)
def test_group_expressions_are_resolved_from_the_registry(line, code):
    findings = lint_source(f"from x import *\n{line}\n")
    assert [(f.line, f.code) for f in findings] == [(2, code)]


@pytest.mark.parametrize(
    "line",
    [
        "with umbrella_span(RLSpanGroup.U_PER_PROMPT, 'x'): pass",
        "with umbrella_span(GymSpanGroup.HTTP_CLIENT, 'x'): pass",
        "with managed_span(RLSpanGroup.DATA_PLANE, 'x'): pass",
        "with managed_span(some_group, 'x'): pass",
        "with managed_span('not_a_registered_group', 'x'): pass",
    ],
)
def test_correct_or_unresolvable_call_sites_are_not_reported(line):
    assert lint_source(f"from x import *\n{line}\n") == []


def test_raw_otel_span_only_counts_in_modules_that_use_our_primitives():
    raw = "with tracer.start_as_current_span('a'):\n    pass\n"
    assert lint_source(raw) == []
    assert [f.code for f in lint_source("span_cm('b')\n" + raw)] == ["raw-otel-span"]


def test_an_allow_comment_on_the_reported_line_suppresses_only_its_codes():
    source = (
        "span_cm('x')\n"
        "tracer.start_span('a')  # nemo-telemetry-lint: allow raw-otel-span (ends after its parent)\n"
        "tracer.start_span('b')  # nemo-telemetry-lint: allow umbrella-alias\n"
        "tracer.start_span('c')  # nemo-telemetry-lint: allow all\n"
        "tracer.start_span('d')  # nemo-telemetry-lint: allow umbrella-alias, raw-otel-span\n"
    )
    assert [(f.line, f.code) for f in lint_source(source)] == [(3, "raw-otel-span")]


def test_carrier_forms_that_count_as_dispatch():
    decorated = "class A:\n    @accepts_trace_context\n    def m(self, x):\n        pass\n"
    for call in (
        "dispatch_with_trace_context(a.m, 1)",
        "dispatch_with_trace_context(a.m.options(num_returns='streaming'), 1)",
        "a.m.remote(1, **trace_context_kwargs())",
        "a.m.options(name='x').remote(1, trace_carrier=carrier)",
        "group.run_all('m', common_kwargs={**trace_context_kwargs()})",
    ):
        assert lint_source(decorated + call + "\n") == [], call
    bare = lint_source(decorated + "a.m.options(name='x').remote(1)\n")
    assert [(f.line, f.code) for f in bare] == [(5, "undispatched-carrier")]


def test_unreadable_input_raises_a_typed_error_naming_the_file(tmp_path):
    with pytest.raises(LintError, match="no such file"):
        lint_paths([tmp_path / "missing"])
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n")
    with pytest.raises(LintError, match=r"broken\.py:1"):
        lint_paths([tmp_path])


# -- through the CLI ----------------------------------------------------------------------------


def test_cli_text_output_and_exit_code_1_on_findings():
    result = runner.invoke(app, ["lint", str(VIOLATIONS)])
    assert result.exit_code == 1
    lines = [line for line in result.stdout.splitlines() if line]
    assert lines == [str(f) for f in lint_paths([VIOLATIONS])]


def test_cli_json_output_is_a_list_of_findings():
    result = runner.invoke(app, ["lint", str(VIOLATIONS), "--format", "json"])
    assert result.exit_code == 1
    payload = json.loads(result.stdout)
    assert payload == [f.to_dict() for f in lint_paths([VIOLATIONS])]
    assert set(payload[0]) == {"file", "line", "code", "message"}


def test_cli_clean_tree_exits_0():
    result = runner.invoke(app, ["lint", str(CLEAN), "--format", "json"])
    assert result.exit_code == 0
    assert json.loads(result.stdout) == []


def test_cli_unreadable_input_exits_2(tmp_path):
    result = runner.invoke(app, ["lint", str(tmp_path / "missing")])
    assert result.exit_code == 2


def test_cli_help_has_an_example():
    result = runner.invoke(app, ["lint", "--help"])
    assert result.exit_code == 0
    assert "Example: nemo-telemetry lint" in result.stdout

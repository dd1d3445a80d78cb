"""``lint``: the drift test for instrumentation call sites, read from source without importing it.

Mistakes here do not raise at run time (telemetry never ends a training run); they show up much
later as a goodput breakdown that double counts, or as rollouts missing from the waterfall. So
they are caught at review time, from the AST of the tree:

=======================  =================================================================
code                     what it means
=======================  =================================================================
leaf-on-umbrella         ``managed_span`` / ``trace_fn`` opened on an umbrella group
umbrella-on-leaf         ``umbrella_span`` / ``umbrella_trace_fn`` opened on a leaf group
umbrella-alias           an umbrella call site spells its group without the ``U_`` alias
undispatched-carrier     an ``@accepts_trace_context`` method called with ``.remote()`` and no
                         carrier, or never dispatched with one anywhere in the tree
raw-otel-span            ``start_as_current_span`` / ``start_span`` in a module that uses our
                         primitives: that span escapes bucket tagging and the group gate
=======================  =================================================================

Whether a group is an umbrella comes from the registry (``GroupName.umbrella``), the same
declaration the instrument side and the analysis read. Group expressions are resolved from
``RLSpanGroup.X`` / ``GymSpanGroup.X`` attributes, any ``<Class>.<NAME>`` whose name is a
registered group, and string literals; anything else (a variable) is not judged.
Dispatch is matched by method *name* across the tree, since the receiver's class is not known
statically; a method name shared by an unrelated class can hide or produce a finding.

A deliberate exception is written where it happens, as a comment on the reported line:
``# nemo-telemetry-lint: allow raw-otel-span`` (several codes comma-separated, or ``all``).
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable

from nemo_telemetry.errors import LintError
from nemo_telemetry.instrument import REGISTRY, GroupName, GymSpanGroup, RLSpanGroup
from nemo_telemetry.instrument.propagation import TRACE_CARRIER_KWARG

__all__ = ["LintFinding", "LintError", "LINT_CODES", "lint_paths", "lint_source"]

LINT_CODES: dict[str, str] = {
    "leaf-on-umbrella": "a leaf primitive (managed_span, trace_fn) opened on an umbrella group",
    "umbrella-on-leaf": "an umbrella primitive (umbrella_span, umbrella_trace_fn) opened on a leaf group",
    "umbrella-alias": "an umbrella group not spelled with its U_ alias at an umbrella call site",
    "undispatched-carrier": "an @accepts_trace_context method dispatched without a trace carrier",
    "raw-otel-span": "a span opened with the OpenTelemetry API in a module that uses our primitives",
}

LEAF_PRIMITIVES = frozenset({"managed_span", "trace_fn"})
UMBRELLA_PRIMITIVES = frozenset({"umbrella_span", "umbrella_trace_fn"})
OUR_PRIMITIVES = LEAF_PRIMITIVES | UMBRELLA_PRIMITIVES | frozenset(
    {"span_cm", "startup_span", "setup_span", "efficiency_span", "start_efficiency_span"}
)
RAW_OTEL_SPAN_CALLS = frozenset({"start_as_current_span", "start_span"})
GROUP_CLASSES = {"RLSpanGroup": RLSpanGroup, "GymSpanGroup": GymSpanGroup}
_ALLOW_COMMENT = re.compile(r"#\s*nemo-telemetry-lint:\s*allow\s+([a-z][a-z, -]*)")
_SKIPPED_DIRS = frozenset({".git", ".venv", "venv", "__pycache__", "node_modules", "build", "dist", ".tox"})


@dataclass(frozen=True, order=True)
class LintFinding:
    """One finding: where, which stable code, and what to do."""

    file: str
    line: int
    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.code}: {self.message}"

    def to_dict(self) -> dict:
        return asdict(self)


# -- public entry points ------------------------------------------------------------------------


def lint_paths(paths: Iterable[str | os.PathLike]) -> list[LintFinding]:
    """Findings for every ``.py`` file under ``paths`` (files or directories), sorted by file and line.

    Raises :class:`LintError` naming the path when one does not exist or a file does not parse.
    """
    modules = [_scan(_read(path), str(path)) for path in _python_files(paths)]
    return _findings(modules)


def lint_source(source: str, *, filename: str = "<string>") -> list[LintFinding]:
    """Findings for one module's source (dispatch is looked for in this module only)."""
    return _findings([_scan(source, filename)])


# -- reading the tree ---------------------------------------------------------------------------


def _python_files(paths: Iterable[str | os.PathLike]) -> list[Path]:
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files.extend(_walk(path))
        else:
            raise LintError(f"{path}: no such file or directory; pass Python files or directories to lint")
    return files


def _walk(root: Path) -> list[Path]:
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIPPED_DIRS and not d.startswith("."))
        found.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py"))
    return found


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LintError(f"{path}: cannot be read ({exc}); lint reads UTF-8 Python source") from None


# -- one module ---------------------------------------------------------------------------------


@dataclass
class _Module:
    """What one module contributes: its own findings and the dispatch facts lint joins across files."""

    file: str
    findings: list[LintFinding] = field(default_factory=list)
    accepting: list[tuple[int, str, str]] = field(default_factory=list)  # line, qualname, method
    dispatched: set[str] = field(default_factory=set)  # method names dispatched with a carrier
    bare_remote: list[tuple[int, str, str]] = field(default_factory=list)  # line, method, call text
    raw_spans: list[tuple[int, str]] = field(default_factory=list)
    uses_primitives: bool = False
    allowed: dict[int, frozenset[str]] = field(default_factory=dict)  # line -> codes allowed there

    def is_allowed(self, finding: LintFinding) -> bool:
        codes = self.allowed.get(finding.line, frozenset())
        return finding.code in codes or "all" in codes


def _scan(source: str, filename: str) -> _Module:
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as exc:
        raise LintError(f"{filename}:{exc.lineno}: cannot be parsed ({exc.msg}); fix the syntax error") from None
    module = _Module(filename, allowed=_allow_comments(source))
    _Visitor(module).visit(tree)
    return module


def _allow_comments(source: str) -> dict[int, frozenset[str]]:
    allowed: dict[int, frozenset[str]] = {}
    for number, line in enumerate(source.splitlines(), start=1):
        match = _ALLOW_COMMENT.search(line)
        if match:
            allowed[number] = frozenset(c for c in re.split(r"[,\s]+", match.group(1)) if c)
    return allowed


def _callee(node: ast.expr) -> str | None:
    """The called name: ``f`` for ``f(...)``, ``m`` for ``a.b.m(...)``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _dispatched_method(node: ast.expr) -> str | None:
    """The actor method in ``actor.m``, ``actor.m.options(...)`` (what dispatch or ``.remote`` is called on)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "options":
        node = node.func.value
    return node.attr if isinstance(node, ast.Attribute) else None


def _carries_carrier(call: ast.Call) -> bool:
    """A carrier keyword, ``**trace_context_kwargs()`` or a carrier dict key anywhere in the arguments."""
    for kw in call.keywords:
        if kw.arg == TRACE_CARRIER_KWARG:
            return True
    for arg in [*call.args, *(kw.value for kw in call.keywords)]:
        for node in ast.walk(arg):
            if isinstance(node, ast.Call) and _callee(node.func) == "trace_context_kwargs":
                return True
            if isinstance(node, ast.Constant) and node.value == TRACE_CARRIER_KWARG:
                return True
            if isinstance(node, ast.Call) and any(k.arg == TRACE_CARRIER_KWARG for k in node.keywords):
                return True
    return False


class _Visitor(ast.NodeVisitor):
    def __init__(self, module: _Module) -> None:
        self.module = module
        self.scope: list[str] = []

    def _def(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if any(_callee(d.func if isinstance(d, ast.Call) else d) == "accepts_trace_context"
               for d in node.decorator_list):
            self.module.accepting.append((node.lineno, ".".join([*self.scope, node.name]), node.name))
        self._scoped(node)

    visit_FunctionDef = _def
    visit_AsyncFunctionDef = _def

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._scoped(node)

    def _scoped(self, node: ast.AST) -> None:
        self.scope.append(node.name)  # type: ignore[attr-defined]
        self.generic_visit(node)
        self.scope.pop()

    def visit_Call(self, node: ast.Call) -> None:
        name = _callee(node.func)
        if name in OUR_PRIMITIVES:
            self.module.uses_primitives = True
            if name in LEAF_PRIMITIVES or name in UMBRELLA_PRIMITIVES:
                self._check_primitive(node, name)
        elif name in RAW_OTEL_SPAN_CALLS and isinstance(node.func, ast.Attribute):
            self.module.raw_spans.append((node.lineno, name))
        elif name == "dispatch_with_trace_context" and node.args:
            method = _dispatched_method(node.args[0])
            if method is not None:
                self.module.dispatched.add(method)
        elif name == "remote" and isinstance(node.func, ast.Attribute):
            self._record_remote(node)
        if name != "dispatch_with_trace_context" and _carries_carrier(node):
            # a worker group that names the method by string and forwards **trace_context_kwargs()
            self.module.dispatched.update(
                a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
            )
        self.generic_visit(node)

    def _record_remote(self, node: ast.Call) -> None:
        method = _dispatched_method(node.func.value)  # type: ignore[attr-defined]
        if method is None:
            return
        if _carries_carrier(node):
            self.module.dispatched.add(method)
        else:
            self.module.bare_remote.append((node.lineno, method, ast.unparse(node.func)))

    def _check_primitive(self, node: ast.Call, primitive: str) -> None:
        expr = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "group"), None)
        resolved = _resolve_group(expr) if expr is not None else None
        if resolved is None:
            return
        decl, spelling = resolved
        finding = _primitive_finding(primitive, decl, spelling)
        if finding is not None:
            code, message = finding
            self.module.findings.append(LintFinding(self.module.file, node.lineno, code, message))


# -- groups -------------------------------------------------------------------------------------


def _resolve_group(expr: ast.expr) -> tuple[GroupName, str] | None:
    """``(declaration, how it was spelled)`` for a group expression lint can read, else None."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        decl = REGISTRY.declaration(expr.value)
        return (decl, repr(expr.value)) if decl is not None else None
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
        cls_name, attr = expr.value.id, expr.attr
        spelling = f"{cls_name}.{attr}"
        known = GROUP_CLASSES.get(cls_name)
        if known is not None:
            value = getattr(known, attr, None)
            return (value, spelling) if isinstance(value, GroupName) else None
        name = attr[2:] if attr.startswith("U_") else attr
        decl = REGISTRY.declaration(name.lower())
        return (decl, spelling) if decl is not None else None
    return None


def _umbrella_aliases() -> dict[str, str]:
    """Group name -> its ``Class.U_NAME`` spelling, for every alias the shipped classes declare."""
    aliases: dict[str, str] = {}
    for cls_name, cls in GROUP_CLASSES.items():
        for attr, value in vars(cls).items():
            if attr.startswith("U_") and isinstance(value, GroupName):
                aliases.setdefault(str(value), f"{cls_name}.{attr}")
    return aliases


def _primitive_finding(primitive: str, decl: GroupName, spelling: str) -> tuple[str, str] | None:
    if primitive in LEAF_PRIMITIVES and decl.umbrella:
        umbrella = "umbrella_span" if primitive == "managed_span" else "umbrella_trace_fn"
        return ("leaf-on-umbrella",
                f"{primitive}({spelling}) opens a span on the umbrella group {str(decl)!r}; "
                f"use {umbrella}({_umbrella_aliases().get(str(decl), spelling)}, ...) so the call site says "
                "it carries no bucket")
    if primitive in UMBRELLA_PRIMITIVES and not decl.umbrella:
        leaf = "managed_span" if primitive == "umbrella_span" else "trace_fn"
        return ("umbrella-on-leaf",
                f"{primitive}({spelling}) opens an umbrella on the leaf group {str(decl)!r} "
                f"(bucket {decl.bucket}); it is emitted as a leaf anyway, so use {leaf}({spelling}, ...)")
    alias = _umbrella_aliases().get(str(decl))
    if primitive in UMBRELLA_PRIMITIVES and alias is not None and spelling.rsplit(".", 1)[-1] != alias.split(".")[1]:
        return ("umbrella-alias",
                f"{primitive}({spelling}): spell the umbrella group as {alias} so the call site shows "
                "it enters no bucket rollup")
    return None


# -- the whole tree -----------------------------------------------------------------------------


def _findings(modules: list[_Module]) -> list[LintFinding]:
    findings: list[LintFinding] = []
    dispatched = set().union(*(m.dispatched for m in modules)) if modules else set()
    accepting = {method for m in modules for _, _, method in m.accepting}
    bare_reported: set[str] = set()
    for module in modules:
        findings.extend(module.findings)
        findings.extend(_raw_span_findings(module))
        for line, method, text in module.bare_remote:
            if method in accepting:
                bare_reported.add(method)
                target = text.removesuffix(".remote")
                findings.append(LintFinding(
                    module.file, line, "undispatched-carrier",
                    f"{text}() sends no trace carrier to the @accepts_trace_context method {method!r}, so the "
                    f"actor's spans start their own trace; use dispatch_with_trace_context({target}, ...)"))
    for module in modules:
        for line, qualname, method in module.accepting:
            if method not in dispatched and method not in bare_reported:
                findings.append(LintFinding(
                    module.file, line, "undispatched-carrier",
                    f"{qualname} is decorated with @accepts_trace_context but no call in the tree sends it a "
                    f"carrier; dispatch it with dispatch_with_trace_context(<actor>.{method}, ...) or pass "
                    "**trace_context_kwargs()"))
    by_file = {m.file: m for m in modules}
    return sorted(f for f in findings if not by_file[f.file].is_allowed(f))


def _raw_span_findings(module: _Module) -> list[LintFinding]:
    if not module.uses_primitives:
        return []
    return [
        LintFinding(module.file, line, "raw-otel-span",
                    f"{call}() opens a span with the OpenTelemetry API in a module that uses nemo_telemetry "
                    "primitives; it escapes the group gate and rl.bucket tagging, so open it with "
                    "managed_span / umbrella_span instead")
        for line, call in module.raw_spans
    ]

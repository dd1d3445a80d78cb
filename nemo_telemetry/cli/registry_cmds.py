"""``resolve`` and ``groups``: what a span_groups spec turns on, and the whole catalogue."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import typer

from nemo_telemetry.cli._common import EXIT_USAGE, console, fail, library_errors, print_json
from nemo_telemetry.cli.app import app
from nemo_telemetry.instrument import REGISTRY, TelemetryConfig

if TYPE_CHECKING:
    from rich.table import Table

DRIVER_NAMESPACE = TelemetryConfig().namespace
ALL_NAMESPACES = "all"
_NAMESPACE_HELP = (f"Whose presets to use: nemo_rl, nemo_gym, ... (default: {DRIVER_NAMESPACE}, as the driver "
                   f"resolves); '{ALL_NAMESPACES}': each preset is the union over every namespace.")


@app.command()
def resolve(
    spec: str = typer.Argument(..., help="A span_groups spec: presets and group names, comma-separated."),
    namespace: Optional[str] = typer.Option(None, "--namespace", "-n", help=_NAMESPACE_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print {spec, groups, pending} as JSON."),
) -> None:
    """Show the groups a span_groups spec selects: what the driver would enable.

    Example: nemo-telemetry resolve per_step,per_prompt --namespace nemo_rl
    """
    chosen = DRIVER_NAMESPACE if namespace is None else namespace.strip().lower()
    scope = None if chosen == ALL_NAMESPACES else chosen
    if scope is not None and scope not in REGISTRY.namespaces():
        raise fail(f"--namespace {namespace}: not a registered namespace; choose one of "
                   f"{', '.join(REGISTRY.namespaces())} or {ALL_NAMESPACES}")
    with library_errors():
        enabled, pending = REGISTRY.resolve_with_pending(spec, namespace=scope)
    if as_json:
        print_json({"spec": spec, "groups": sorted(enabled), "pending": sorted(pending)})
    else:
        console().print(_groups_table(f"span_groups: {spec} (namespace {chosen})", sorted(enabled)))
    if pending:
        raise fail(REGISTRY.describe_pending(pending, namespace=scope), EXIT_USAGE)


@app.command()
def groups(
    as_json: bool = typer.Option(False, "--json", help="Print the catalogue as a JSON list."),
) -> None:
    """List every registered span group: bucket or umbrella, presets, the spans it controls.

    Example: nemo-telemetry groups --json
    """
    if as_json:
        print_json([info.to_dict() for info in REGISTRY.catalogue()])
        return
    out = console()
    out.print(_groups_table("span groups", [info.name for info in REGISTRY.catalogue()]))
    for namespace in REGISTRY.namespaces():
        for preset, members in REGISTRY.presets(namespace).items():
            out.print(f"[bold]{namespace}:{preset}[/] = {', '.join(sorted(members))}")
    out.print("[bold]all[/] = every registered group")


_BUCKET_STYLE = {"productive": "green", "overhead": "yellow", "idle": "blue", "wasted": "red"}


def _groups_table(title: str, names: list[str]) -> Table:
    from rich.table import Table

    catalogue = {info.name: info for info in REGISTRY.catalogue()}
    table = Table(title=title, show_lines=False)
    for column in ("group", "bucket", "presets", "spans", "what it covers"):
        table.add_column(column, overflow="fold")
    for name in names:
        info = catalogue[name]
        bucket = "umbrella" if info.umbrella else f"[{_BUCKET_STYLE[info.bucket]}]{info.bucket}[/]"
        spans = "\n".join(
            s + ("  (unbucketed)" if s in info.unbucketed_spans else "") for s in info.spans
        )
        table.add_row(name, bucket, "\n".join(info.presets) or "all only", spans, info.description)
    return table

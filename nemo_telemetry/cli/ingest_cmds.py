"""``ingest`` and ``collect``: OTLP dumps or live OTLP/HTTP exports into a Parquet dataset."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer

from nemo_telemetry.analysis import DEFAULT_MAX_CONNECTIONS, DEFAULT_READ_TIMEOUT_S, FORMATS
from nemo_telemetry.cli._common import (console, fail, library_errors, print_json, ray_messages_on_stderr,
                                        stop_on_signals, warn_line)
from nemo_telemetry.cli.app import app
from nemo_telemetry.errors import ListenError

if TYPE_CHECKING:
    from nemo_telemetry.analysis import CollectorServer, CollectSummary, IngestSummary

# The ingest, the receiver and rich are imported inside each command, so that defining the
# commands, and so `--help`, loads none of them.

_WARNINGS_SHOWN = 20


@app.command()
def ingest(
    inputs: List[Path] = typer.Argument(..., help="Dump files or directories of them (rotated files)."),
    out: Path = typer.Option(..., "--out", "-o", help="Dataset directory to create or append to."),
    format: Optional[str] = typer.Option(  # the option's name
        None, "--format", "-f", help=f"Force the input format ({', '.join(FORMATS)}); default: detect."
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar and no summary."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    engine: str = typer.Option("local", "--engine", help="local: decode in this process; ray: decode the files "
                                                         "in parallel Ray tasks (RAY_ADDRESS's cluster, else a "
                                                         "local one)."),
    max_request_mib: Optional[float] = typer.Option(
        None, "--max-request-mib", help="Longest line, protobuf record or JSON document, once decompressed "
        "(default 64, collect's bound on a request); a longer one is rejected and named, the rest kept."),
    stall_timeout_s: Optional[float] = typer.Option(
        None, "--stall-timeout-s", help="--engine ray: a file's decode task that sends nothing this long fails "
                                        "the ingest (exit 2; default 900). A task whose worker dies is run again "
                                        "(4 attempts in all)."),
) -> None:
    """Ingest OTLP dumps (JSON lines, length-prefixed protobuf, OTLP/JSON; .gz/.zst) into a Parquet dataset.

    Example: nemo-telemetry ingest otel-dumps/ --out run.dataset
    """
    from nemo_telemetry.analysis import dump_files, ingest_with_engine

    if max_request_mib is not None and not max_request_mib > 0:
        raise fail(f"--max-request-mib {max_request_mib!r}: give a size in MiB > 0")
    if stall_timeout_s is not None and not stall_timeout_s > 0:
        raise fail("--stall-timeout-s must be positive")
    bound = None if max_request_mib is None else int(max_request_mib * (1 << 20))
    with library_errors(), ray_messages_on_stderr(engine):
        total = sum(path.stat().st_size for path in dump_files(inputs))
        if quiet or as_json:
            summary = ingest_with_engine(inputs, out=out, engine=engine, format=format, max_request_bytes=bound,
                                         stall_timeout_s=stall_timeout_s)
        else:
            summary = _ingest_with_progress(inputs, out, format, total, engine, bound, stall_timeout_s)
    if as_json:
        print_json({name: getattr(summary, name) for name in summary.__dataclass_fields__})
    elif not quiet:
        _print_summary(summary, out)


def _ingest_with_progress(inputs: List[Path], out: Path, fmt: Optional[str], total: int,
                          engine: str = "local", bound: Optional[int] = None,
                          stall_timeout_s: Optional[float] = None) -> IngestSummary:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

    from nemo_telemetry.analysis import ingest_with_engine

    columns = (
        TextColumn("[bold]ingest"),
        BarColumn(),
        DownloadColumn(),
        TextColumn("{task.fields[spans]:,} spans"),
        TimeElapsedColumn(),
        _compiling_column(),
    )
    with Progress(*columns, console=console(stderr=True), transient=True) as progress:
        task = progress.add_task("ingest", total=total or None, spans=0)

        def update(bytes_done: int, spans_done: int) -> None:
            progress.update(task, completed=bytes_done, spans=spans_done)

        return ingest_with_engine(inputs, out=out, engine=engine, format=fmt, progress=update,
                                  max_request_bytes=bound, stall_timeout_s=stall_timeout_s)


def _compiling_column():
    """A progress column that says so while the compiled kernels compile (no bytes move
    meanwhile); rendered on rich's refresh thread, so it shows during the compilation itself."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    from nemo_telemetry.analysis import kernels_compiling

    class CompilingColumn(ProgressColumn):
        def render(self, task) -> Text:
            return Text("compiling the ingest kernels (once)", style="yellow") if kernels_compiling() else Text("")

    return CompilingColumn()


def _print_summary(summary: IngestSummary, out: Path) -> None:
    from rich.table import Table

    table = Table(title=f"ingested into {out}", show_header=False)
    table.add_column("what")
    table.add_column("count", justify="right")
    rows = ("files", "spans", "events", "links", "traces", "runs", "duplicates_dropped", "rejected_records")
    signals = ("metric_points", "logs")  # what the dumps held of the other signals, told by content
    for name in rows + ("skipped_records", "skipped_files") + signals:
        table.add_row(name.replace("_", " "), f"{getattr(summary, name):,}")
    output = console()
    output.print(table)
    _print_warnings(summary.warnings)


def _print_warnings(warnings: tuple[str, ...]) -> None:
    err = console(stderr=True)
    for warning in warnings[:_WARNINGS_SHOWN]:
        err.print(f"[yellow]warning:[/] {warning}", markup=True, highlight=False)
    if len(warnings) > _WARNINGS_SHOWN:
        err.print(f"[yellow]... and {len(warnings) - _WARNINGS_SHOWN} more rejected records[/]", markup=True)


@app.command()
def collect(
    out: Path = typer.Option(..., "--out", "-o", help="Dataset directory to append received spans, metrics and logs to."),
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to listen on (default: this machine only)."),
    port: int = typer.Option(4318, "--port", "-p", help="Port (4318 is OTLP/HTTP's); 0 picks a free one."),
    max_request_mib: float = typer.Option(64.0, "--max-request-mib", help="Larger requests (a Content-Length, "
                                          "chunked or inflated gzip body) get 413."),
    max_connections: int = typer.Option(DEFAULT_MAX_CONNECTIONS, "--max-connections",
                                        help="Concurrent connections served; more get 503 with Retry-After."),
    read_timeout_s: float = typer.Option(DEFAULT_READ_TIMEOUT_S, "--read-timeout-s",
                                         help="A connection silent this long is closed (idle keep-alive, or "
                                              "408 inside a request)."),
    token_file: Optional[Path] = typer.Option(None, "--token-file", help="Require 'Authorization: Bearer <token>' "
                                              "on every request (401 otherwise); the token is this file's first line."),
    tls_cert: Optional[Path] = typer.Option(None, "--tls-cert", help="Serve HTTPS with this PEM certificate chain "
                                            "(with --tls-key)."),
    tls_key: Optional[Path] = typer.Option(None, "--tls-key", help="The PEM private key of --tls-cert."),
    insecure: bool = typer.Option(False, "--insecure", help="Listen on a --host beyond loopback without "
                                  "--token-file (refused otherwise)."),
) -> None:
    """Receive OTLP/HTTP traces, metrics and logs (POST /v1/traces, /v1/metrics, /v1/logs; protobuf
    or JSON) into a dataset until Ctrl-C.

    A request is answered 200 only once it is committed on disk (a body that is not a request of
    its endpoint's signal: 400); a failed write is
    answered 503 with Retry-After (the exporter sends it again). Bounds: one request
    --max-request-mib (413 beyond); --max-connections (503 beyond); a socket read waits at most
    --read-timeout-s; one request must arrive whole within 60 s (408); listen backlog 1024.
    Ctrl-C or SIGTERM, at any moment (even while the kernels compile), stops within about a
    second plus the commit in flight. Exit 2 if any span received was left unwritten (the reason
    is printed), or the port cannot be bound, or a --host beyond loopback has no --token-file
    (unless --insecure).

    Example: nemo-telemetry collect --out run.dataset --port 4318
    """
    if max_request_mib <= 0 or max_connections <= 0 or read_timeout_s <= 0:
        raise fail("--max-request-mib, --max-connections and --read-timeout-s must be positive")
    err = console(stderr=True)

    def ready(server: CollectorServer) -> None:
        err.print(f"collecting OTLP/HTTP traces at [bold]{server.traces_url}[/] (metrics and logs at /v1/metrics, "
                  f"/v1/logs) into {out}; Ctrl-C to stop", markup=True)
        if server.unguarded:
            warn_line(f"--insecure: anyone who reaches {server.url} can write spans into {out}; --token-file guards it")

    with stop_on_signals() as stop:
        from nemo_telemetry.analysis import read_token_file, run_collector

        with library_errors():
            token = read_token_file(token_file) if token_file is not None else None
            try:
                summary = run_collector(
                    out, host=host, port=port, max_request_bytes=int(max_request_mib * (1 << 20)),
                    max_connections=max_connections, read_timeout_s=read_timeout_s, on_ready=ready, stop=stop,
                    token=token, tls_cert=tls_cert, tls_key=tls_key, insecure=insecure,
                )
            except ListenError as exc:
                raise fail(f"{exc}; choose another --port") from None
        _print_collect_summary(summary, out)
    if summary.unwritten_spans:
        raise fail(f"{summary.unwritten_spans:,} received spans were not written to {out} "
                   f"({summary.write_error}); their exporters got 503 and may still hold them")


def _print_collect_summary(summary: CollectSummary, out: Path) -> None:
    from rich.table import Table

    table = Table(title=f"collected into {out}", show_header=False)
    table.add_column("what")
    table.add_column("count", justify="right")
    for name in summary.__dataclass_fields__:
        value = getattr(summary, name)
        if isinstance(value, int):
            table.add_row(name.replace("_", " "), f"{value:,}")
        elif value:
            table.add_row(name.replace("_", " "), value)
    console().print(table)


@app.command()
def warmup() -> None:
    """Compile every ingest kernel once into the kernel cache (a Dockerfile or Ray runtime_env
    setup step), so that no later command waits for the compiler; fast when already warm.

    Example (Dockerfile): RUN NEMO_TELEMETRY_KERNEL_CACHE_DIR=/opt/kernels nemo-telemetry warmup
    """
    from nemo_telemetry.analysis import warm_up_kernels

    with library_errors():
        result = warm_up_kernels()
    out = console()
    for name, functions in result.compiled:
        out.print(f"{name}: {', '.join(functions) or 'loaded'}")
    for name, why in result.failed:
        out.print(f"{name}: not compiled ({why}); its reference path serves instead")
    where = result.cache_dir if result.cache_dir is not None else "nowhere (no writable cache directory)"
    out.print(f"kernel cache: {where} ({result.seconds:.1f} s)", soft_wrap=True)

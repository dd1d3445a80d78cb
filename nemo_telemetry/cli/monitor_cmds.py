"""``monitor``: goodput per step while the run trains, from a followed dump directory or as a receiver."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import orjson
import typer

from nemo_telemetry.cli._common import EXIT_FINDINGS, console, fail, library_errors, stop_on_signals, warn_line
from nemo_telemetry.cli.app import app


@app.command("monitor")
def monitor(
    follow: Optional[Path] = typer.Option(None, "--follow", help="Dump directory the run's processes write "
                                                                 "(new files, appended lines, rotated files)."),
    port: Optional[int] = typer.Option(None, "--port", "-p", help="Receive OTLP/HTTP on this port (127.0.0.1; "
                                                                  "0 picks a free one), as `collect` does."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="With --port: the dataset the received spans are "
                                                                 "written to (a restart resumes from it)."),
    until_idle: Optional[float] = typer.Option(None, "--until-idle", help="Stop after this many seconds "
                                                                          "without a new span."),
    output_format: str = typer.Option("table", "--format", help="table: a live view; json: one line per "
                                                                "finished step."),
    alert_below: Optional[float] = typer.Option(None, "--alert-below", help="Alert when rolling goodput falls "
                                                                            "below this (0-1)."),
    over: int = typer.Option(10, "--over", min=1, help="Steps the rolling goodput covers."),
    exit_on_alert: bool = typer.Option(False, "--exit-on-alert", help="Stop and exit 1 at the first alert."),
    grace: float = typer.Option(5.0, "--grace", help="Seconds after a step's window ends before it is reported."),
    metrics_port: Optional[int] = typer.Option(None, "--metrics-port", help="Serve rl.goodput.* as Prometheus "
                                                                            "/metrics on 127.0.0.1 (0: a free port)."),
    otlp_metrics: bool = typer.Option(False, "--otlp-metrics", help="Push rl.goodput.* over OTLP metrics to "
                                                                    "OTEL_EXPORTER_OTLP_(METRICS_)ENDPOINT."),
    host: str = typer.Option("127.0.0.1", "--host", help="Interface the receiver and /metrics listen on."),
    max_request_mib: float = typer.Option(64.0, "--max-request-mib", help="Largest request, once decompressed: "
                                          "a received body (larger: 413, as collect), a followed file's line, "
                                          "protobuf record or JSON document (larger: rejected and named)."),
    token_file: Optional[Path] = typer.Option(None, "--token-file", help="With --port: require 'Authorization: "
                                              "Bearer <token>' on every request (401 otherwise), as `collect` does."),
    tls_cert: Optional[Path] = typer.Option(None, "--tls-cert", help="With --port: serve HTTPS with this PEM "
                                            "certificate chain (with --tls-key)."),
    tls_key: Optional[Path] = typer.Option(None, "--tls-key", help="The PEM private key of --tls-cert."),
    insecure: bool = typer.Option(False, "--insecure", help="With --port: listen on a --host beyond loopback "
                                  "without --token-file (refused otherwise)."),
) -> None:
    """Report each training step's goodput as its spans complete; export rl.goodput.* metrics.

    A step is reported once its window closed and --grace passed; a span that arrives later reports
    it again (JSON: "revised": true). Exit 1 with --exit-on-alert when rolling goodput over --over
    steps falls below --alert-below; 2 on bad usage, or (with --port) when a span received was left
    unwritten (a full disk: the reason is printed), as `collect` does, or a --host beyond loopback
    has no --token-file (unless --insecure). Ctrl-C or SIGTERM stops it at any moment.

    Example: nemo-telemetry monitor --follow run42/dumps --alert-below 0.5 --over 20 --metrics-port 9464
    """
    if output_format not in ("table", "json"):
        raise fail(f"--format {output_format!r}: choose table or json")
    if not max_request_mib > 0:
        raise fail(f"--max-request-mib {max_request_mib!r}: give a size in MiB > 0")
    err = console(stderr=True)
    view_console = console()
    as_json = output_format == "json"

    def on_step(record) -> None:
        if as_json:
            sys.stdout.write(orjson.dumps(record.to_dict()).decode() + "\n")
            sys.stdout.flush()

    def on_alert(alert) -> None:
        err.print(f"[bold red]{alert.message}[/]", soft_wrap=True)

    def on_ready(where: dict) -> None:
        if where["traces_url"]:
            err.print(f"monitor: receiving OTLP/HTTP traces on {where['traces_url']}", soft_wrap=True)
        if where.get("unguarded"):
            warn_line(f"--insecure: anyone who reaches {where['traces_url']} can write spans; --token-file guards it")
        if where["metrics_url"]:
            err.print(f"monitor: Prometheus metrics on {where['metrics_url']}", soft_wrap=True)

    options = dict(follow=follow, port=port, out=out, host=host, until_idle_s=until_idle, grace_s=grace,
                   rolling_steps=over, keep_steps=max(256, over), alert_below=alert_below,
                   exit_on_alert=exit_on_alert, metrics_port=metrics_port, otlp_metrics=otlp_metrics,
                   max_request_bytes=int(max_request_mib * (1 << 20)), on_step=on_step, on_alert=on_alert,
                   on_ready=on_ready,
                   tls_cert=tls_cert, tls_key=tls_key, insecure=insecure)
    with stop_on_signals() as stop, library_errors():  # taken first: a signal while it loads stops it cleanly
        from nemo_telemetry.analysis import read_token_file, run_monitor  # loaded only here

        options["token"] = read_token_file(token_file) if token_file is not None else None

        if as_json:
            summary = run_monitor(**options, stop=stop)
        else:
            summary = _run_live(run_monitor, dict(options, stop=stop), view_console)
    _print_end(summary, err)
    unwritten = summary.receiver.unwritten_spans if summary.receiver is not None else 0
    if unwritten:
        raise fail(f"{unwritten:,} received spans were not written to {out or 'the dataset'} "
                   f"({summary.receiver.write_error}); their exporters got 503 and may still hold them")
    if exit_on_alert and summary.alerts:
        raise typer.Exit(EXIT_FINDINGS)


def _run_live(run_monitor, options: dict, out):
    from rich.live import Live

    from nemo_telemetry.cli.render import bar_width_for, render_monitor

    with Live(console=out, auto_refresh=False, transient=False) as live:
        def on_view(view) -> None:
            live.update(render_monitor(view, bar_width=bar_width_for(out.width)), refresh=True)

        return run_monitor(**options, on_view=on_view)


def _print_end(summary, err) -> None:
    for run in summary.runs:
        goodput = run.total["goodput"]
        err.print(f"monitor: run {run.run_id}: {run.steps} steps, goodput "
                  f"{'-' if goodput is None else f'{goodput:.3f}'}", soft_wrap=True)
    err.print(f"monitor: {summary.spans} spans, {summary.steps_reported} steps reported, "
              f"{summary.revisions} revised, {summary.late_spans} late spans not applied", soft_wrap=True)
    failed = summary.findings_by_code.get("failed-step", 0)
    if failed:
        warn_line(f"{failed} failed step(s) (failed-step: a span ended in error status); their bucketed time is "
                  "counted as wasted_s: `check` the dataset names each span")
    if summary.follow is not None:
        for warning in summary.follow.warnings:
            warn_line(warning)
        if summary.follow.rejected_records:
            warn_line(f"{summary.follow.rejected_records} record(s) rejected (named above)")
        if summary.follow.reread_files:
            err.print(f"monitor: {summary.follow.reread_files} file(s) read again from their start (truncated, "
                      "rewritten, or a reused inode); repeated spans dropped", soft_wrap=True)
    if summary.receiver is not None and summary.receiver.write_error:
        warn_line(f"writing the dataset failed: {summary.receiver.write_error}")


__all__ = ["monitor"]

"""``nemo-telemetry``: a Typer + rich command-line tool over :mod:`nemo_telemetry.analysis`.

Each command parses its arguments, calls one library function, and renders what comes back.
Library errors become a clean message and exit code 2; nothing here computes.
"""

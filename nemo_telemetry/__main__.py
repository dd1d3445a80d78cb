"""``python -m nemo_telemetry``: the ``nemo-telemetry`` command."""

from nemo_telemetry.cli.app import main

if __name__ == "__main__":
    main()

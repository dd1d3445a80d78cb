"""The environment variables nemo-telemetry reads: :mod:`nemo_telemetry.environment_variables`,
under the name the instrument side has always exported them by.

They live outside ``nemo_telemetry.instrument`` so that the analysis side (the kernel seam's
``NEMO_TELEMETRY_COMPILED``, say) reads them without importing the instrument package and the
OpenTelemetry SDK behind it.
"""

from __future__ import annotations

from nemo_telemetry.environment_variables import *  # noqa: F403 - the one list, re-exported
from nemo_telemetry.environment_variables import __all__  # noqa: F401

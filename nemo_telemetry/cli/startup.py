"""Start-up settings of a command's process that its libraries would otherwise pick on their own.

Imports nothing heavy: ``--help`` loads this module too.
"""

from __future__ import annotations

import sys

__all__ = ["skip_pyarrow_pandas_probe"]


class _HiddenPandas:
    """An import finder under which ``import pandas`` fails, for one question pyarrow asks."""

    def find_spec(self, name, path=None, target=None):
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError("pandas is hidden while pyarrow probes for it", name=name)
        return None


def skip_pyarrow_pandas_probe() -> None:
    """Keep pyarrow from importing pandas (0.2-0.3 s) in a command that holds no pandas object.

    pyarrow imports pandas on its first array conversion (and on importing ``pyarrow.dataset``)
    only to ask whether a value is a pandas object. Answered once with pandas hidden, pyarrow
    takes it as absent from then on, until a call that needs it (``to_pandas``, ``from_pandas``)
    imports it for real, as ``goodput`` does where a dataset has metrics. Nothing changes where
    pandas is loaded already. For the console script's commands only: a library user's process
    may hand pyarrow pandas objects before any such call.
    """
    if "pandas" in sys.modules:
        return
    finder = _HiddenPandas()
    sys.meta_path.insert(0, finder)
    try:
        import pyarrow as pa  # noqa: PLC0415 (--help loads this module, and no pyarrow)

        pa.array([0])
    finally:
        sys.meta_path.remove(finder)

"""What a span group *is*: its name, whether it is an umbrella or its goodput bucket, the
span names it controls, and one line saying what it covers.

A group is declared once, as a constant on a library's group class (``RLSpanGroup.GENERATION``),
and both halves read that declaration: the instrument side for the default ``rl.bucket``, the
analysis side for which span names are umbrellas and which groups should have emitted what.
The constant is a :class:`GroupName`, a ``str`` subclass, so call sites and the enabled-group
frozenset still see plain strings (``RLSpanGroup.U_ROLLOUT == RLSpanGroup.ROLLOUT == "rollout"``).
"""

from __future__ import annotations

import enum
import re
from functools import lru_cache

__all__ = ["Bucket", "GroupName", "group", "span_name_regex"]


class Bucket(str, enum.Enum):
    """Goodput bucket carried by a leaf span as ``rl.bucket``; umbrellas carry none."""

    PRODUCTIVE = "productive"
    OVERHEAD = "overhead"
    IDLE = "idle"
    WASTED = "wasted"

    def __str__(self) -> str:  # "productive", not "Bucket.PRODUCTIVE", in attributes and f-strings
        return self.value


class GroupName(str):
    """A span-group name that also carries its declaration.

    Equal to, and hashed like, the plain string, so it can be used anywhere a group name is.
    """

    umbrella: bool
    bucket: Bucket | None
    spans: tuple[str, ...]
    unbucketed_spans: tuple[str, ...]
    description: str

    def __new__(
        cls,
        name: str,
        *,
        umbrella: bool = False,
        bucket: Bucket | str | None = None,
        spans: tuple[str, ...] = (),
        unbucketed_spans: tuple[str, ...] = (),
        description: str = "",
    ) -> "GroupName":
        if umbrella and bucket is not None:
            raise ValueError(f"span group {name!r}: an umbrella group carries no bucket")
        if not umbrella and bucket is None:
            raise ValueError(f"span group {name!r}: a leaf group needs a default bucket")
        self = super().__new__(cls, name.strip().lower())
        self.umbrella = umbrella
        self.bucket = Bucket(bucket) if bucket is not None else None
        self.spans = tuple(spans)
        self.unbucketed_spans = tuple(unbucketed_spans)
        self.description = description
        return self

    def __reduce__(self):  # pickles (e.g. to Ray workers) as the plain string it equals
        return (str, (str(self),))


def group(name: str, **declaration) -> GroupName:
    """Declare one span group (``umbrella=True`` or ``bucket=``, ``spans=``, ``unbucketed_spans=``,
    ``description=``); assign the result to a constant on a group class."""
    return GroupName(name, **declaration)


# Placeholders used in span-name patterns such as "rl.<algo>.step" or "rl.data_plane.<op>".
_PLACEHOLDERS = {
    "method": r"(?:GET|HEAD|POST|PUT|PATCH|DELETE|OPTIONS|CONNECT|TRACE|HTTP [A-Z]+|[A-Z]+)",
    "route": r"\S*",
}
_DEFAULT_PLACEHOLDER = r"[A-Za-z0-9_]+"
_PLACEHOLDER_RE = re.compile(r"<([A-Za-z_]+)>")


@lru_cache(maxsize=None)
def span_name_regex(pattern: str) -> str:
    """Anchored regex for a span-name pattern: ``rl.<algo>.step`` -> ``^rl\\.[A-Za-z0-9_]+\\.step$``."""
    parts: list[str] = []
    pos = 0
    for match in _PLACEHOLDER_RE.finditer(pattern):
        parts.append(re.escape(pattern[pos : match.start()]))
        parts.append(_PLACEHOLDERS.get(match.group(1).lower(), _DEFAULT_PLACEHOLDER))
        pos = match.end()
    parts.append(re.escape(pattern[pos:]))
    return "^" + "".join(parts) + "$"

"""The span-group registry: which groups and presets exist, by namespace, and what a spec selects.

Each consuming library registers what it emits under its own namespace (``nemo_rl``,
``nemo_gym``, or a user's own). Group names live in one flat space: a group registered by
two namespaces is *shared*, and enabling it turns on both libraries' spans. Presets are
per namespace; resolving a preset name without a namespace takes the union of every
namespace's preset of that name.

``resolve(spec)`` unions presets and bare group names. Names are case-insensitive and
whitespace is ignored; ``all`` is every registered group; there is no subtraction syntax.
A name that matches nothing is *pending* (its library may not be imported yet):
``resolve_with_pending`` returns it separately and ``strict=True`` raises :class:`SpecError`
with the valid options and the closest match.
"""

from __future__ import annotations

import difflib
import logging
import re
import threading
from dataclasses import dataclass
from typing import Iterable, Mapping

from nemo_telemetry.errors import RegistryError, SpecError
from nemo_telemetry.instrument._groups import Bucket, GroupName, span_name_regex

__all__ = ["SpanGroupInfo", "SpanRegistry", "REGISTRY", "ALL_KEYWORD"]

_log = logging.getLogger("nemo_telemetry")

ALL_KEYWORD = "all"


@dataclass(frozen=True)
class SpanGroupInfo:
    """One row of the span-group catalogue, merged over every namespace that registers the group."""

    name: str
    namespaces: tuple[str, ...]
    umbrella: bool
    bucket: str | None
    presets: tuple[str, ...]  # "namespace:preset"
    spans: tuple[str, ...]
    unbucketed_spans: tuple[str, ...]
    description: str

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "namespaces": list(self.namespaces),
            "umbrella": self.umbrella,
            "bucket": self.bucket,
            "presets": list(self.presets),
            "spans": list(self.spans),
            "unbucketed_spans": list(self.unbucketed_spans),
            "description": self.description,
        }


@dataclass(frozen=True)
class _Namespace:
    groups: Mapping[str, GroupName]
    presets: Mapping[str, frozenset[str]]


def _normalise(name: str) -> str:
    return name.strip().lower()


class SpanRegistry:
    """Groups and presets by namespace; thread-safe registration, lock-free reads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._namespaces: dict[str, _Namespace] = {}
        self.version = 0
        """Bumped on every (un)registration, so callers can cache what they derive from it."""

    # -- registration -------------------------------------------------------------------------

    def register(
        self,
        namespace: str,
        groups: Iterable[GroupName],
        presets: Mapping[str, Iterable[str]] | None = None,
        *,
        allow_override: bool = True,
    ) -> None:
        """Declare ``namespace``'s groups and presets, replacing any earlier registration of it.

        Re-registering the same content is a no-op, so import-time registration is idempotent.
        A preset may name only groups of its own namespace or groups already registered.
        """
        namespace = _normalise(namespace)
        declared: dict[str, GroupName] = {}
        for g in groups:
            if not isinstance(g, GroupName):
                raise RegistryError(
                    f"namespace {namespace!r}: {g!r} is a plain string; declare groups with "
                    "nemo_telemetry.instrument.group(name, umbrella=... or bucket=..., spans=...)"
                )
            declared[str(g)] = g
        new = _Namespace(groups=declared, presets=self._check_presets(namespace, declared, presets or {}))
        with self._lock:
            old = self._namespaces.get(namespace)
            if old is not None and not allow_override and old != new:
                raise RegistryError(
                    f"namespace {namespace!r} is already registered with different groups or presets; "
                    "pass allow_override=True to replace it"
                )
            self._warn_on_conflicting_shared_groups(namespace, declared)
            namespaces = dict(self._namespaces)
            namespaces[namespace] = new
            self._namespaces = namespaces  # readers see the old or the new dict, never a half-built one
            self.version += 1

    def unregister(self, namespace: str) -> None:
        """Forget a namespace (tests, and libraries that are unloaded)."""
        with self._lock:
            namespaces = dict(self._namespaces)
            namespaces.pop(_normalise(namespace), None)
            self._namespaces = namespaces
            self.version += 1

    def _check_presets(
        self, namespace: str, declared: Mapping[str, GroupName], presets: Mapping[str, Iterable[str]]
    ) -> dict[str, frozenset[str]]:
        known = set(declared) | self.group_names()
        checked: dict[str, frozenset[str]] = {}
        for preset, members in presets.items():
            names = frozenset(_normalise(m) for m in members)
            unknown = sorted(names - known)
            if unknown:
                raise RegistryError(
                    f"namespace {namespace!r}, preset {preset!r}: unknown groups {unknown}; "
                    "declare them on the namespace's group class first"
                )
            if _normalise(preset) == ALL_KEYWORD or _normalise(preset) in known:
                raise RegistryError(
                    f"namespace {namespace!r}: preset name {preset!r} collides with 'all' or a group name"
                )
            checked[_normalise(preset)] = names
        return checked

    def _warn_on_conflicting_shared_groups(self, namespace: str, declared: Mapping[str, GroupName]) -> None:
        for other_ns, other in self._namespaces.items():
            if other_ns == namespace:
                continue
            for name in declared.keys() & other.groups.keys():
                a, b = declared[name], other.groups[name]
                if (a.umbrella, a.bucket) != (b.umbrella, b.bucket):
                    _log.warning(
                        "span group %r is registered by %r and %r with different buckets (%s vs %s); "
                        "enabling it turns on both libraries' spans",
                        name, namespace, other_ns, a.bucket or "umbrella", b.bucket or "umbrella",
                    )

    # -- reading ------------------------------------------------------------------------------

    def namespaces(self) -> tuple[str, ...]:
        return tuple(sorted(self._namespaces))

    def group_names(self) -> frozenset[str]:
        """Every registered group name, over all namespaces."""
        names: set[str] = set()
        for ns in self._namespaces.values():
            names.update(ns.groups)
        return frozenset(names)

    def presets(self, namespace: str | None = None) -> dict[str, frozenset[str]]:
        """Preset name -> groups; without a namespace, each preset is the union over namespaces."""
        merged: dict[str, set[str]] = {}
        for ns_name, ns in self._namespaces.items():
            if namespace is not None and ns_name != _normalise(namespace):
                continue
            for preset, members in ns.presets.items():
                merged.setdefault(preset, set()).update(members)
        return {k: frozenset(v) for k, v in sorted(merged.items())}

    def declaration(self, name: str) -> GroupName | None:
        """The first registered declaration of a group (bucket / umbrella), or None."""
        name = _normalise(name)
        for ns in self._namespaces.values():
            if name in ns.groups:
                return ns.groups[name]
        return None

    def default_buckets(self) -> dict[str, Bucket | None]:
        """Group -> default bucket (None for umbrellas); the instrument side caches this."""
        out: dict[str, Bucket | None] = {}
        for ns in self._namespaces.values():
            for name, g in ns.groups.items():
                out.setdefault(name, g.bucket)
        return out

    def catalogue(self) -> tuple[SpanGroupInfo, ...]:
        """Every group, merged across namespaces, sorted by name."""
        rows: dict[str, dict] = {}
        for ns_name, ns in sorted(self._namespaces.items()):
            for name, g in ns.groups.items():
                row = rows.setdefault(name, {"decl": g, "namespaces": [], "spans": [], "unbucketed": [],
                                             "presets": []})
                row["namespaces"].append(ns_name)
                row["spans"] += [s for s in g.spans if s not in row["spans"]]
                row["unbucketed"] += [s for s in g.unbucketed_spans if s not in row["unbucketed"]]
        for ns_name, ns in sorted(self._namespaces.items()):
            for preset, members in ns.presets.items():
                for name in members & rows.keys():
                    rows[name]["presets"].append(f"{ns_name}:{preset}")
        return tuple(
            SpanGroupInfo(
                name=name,
                namespaces=tuple(row["namespaces"]),
                umbrella=row["decl"].umbrella,
                bucket=row["decl"].bucket.value if row["decl"].bucket is not None else None,
                presets=tuple(sorted(row["presets"])),
                spans=tuple(row["spans"]),
                unbucketed_spans=tuple(row["unbucketed"]),
                description=row["decl"].description,
            )
            for name, row in sorted(rows.items())
        )

    def groups_for_span_name(self, span_name: str) -> frozenset[str]:
        """Groups whose span-name patterns match ``span_name`` (may be several, e.g. rl.data_plane.put)."""
        return frozenset(
            info.name
            for info in self.catalogue()
            if any(re.match(span_name_regex(p), span_name) for p in info.spans)
        )

    # -- resolving ----------------------------------------------------------------------------

    def resolve(self, spec: str | Iterable[str] | None, *, namespace: str | None = None,
                strict: bool = False) -> frozenset[str]:
        """Groups a ``span_groups`` spec selects; pending names are dropped, or raise when ``strict``."""
        enabled, pending = self.resolve_with_pending(spec, namespace=namespace)
        if strict and pending:
            raise SpecError(self.describe_pending(pending, namespace=namespace))
        return enabled

    def resolve_with_pending(
        self, spec: str | Iterable[str] | None, *, namespace: str | None = None
    ) -> tuple[frozenset[str], frozenset[str]]:
        """``(enabled, pending)``: pending names matched no preset and no registered group."""
        tokens = _tokens(spec)
        subtracted = [t for t in tokens if t.startswith("-")]
        if subtracted:
            raise SpecError(self._no_subtraction_message(spec, tokens, namespace))
        groups = self.group_names()
        presets = self.presets(namespace)
        enabled: set[str] = set()
        pending: set[str] = set()
        for token in tokens:
            if token == ALL_KEYWORD:
                enabled |= groups
            elif token in presets:
                enabled |= presets[token]
            elif token in groups:
                enabled.add(token)
            else:
                pending.add(token)
        return frozenset(enabled), frozenset(pending)

    def valid_names(self, namespace: str | None = None) -> list[str]:
        """Everything a spec may contain: 'all', the presets, then the groups."""
        return [ALL_KEYWORD, *self.presets(namespace), *sorted(self.group_names())]

    def describe_pending(self, pending: Iterable[str], *, namespace: str | None = None) -> str:
        """One message for unknown names: what was given, the closest match, and the valid options."""
        valid = self.valid_names(namespace)
        lines = []
        for name in sorted(pending):
            close = difflib.get_close_matches(name, valid, n=1, cutoff=0.5)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            lines.append(f"unknown span group {name!r}{hint}")
        lines.append("valid options: " + ", ".join(valid))
        lines.append("a group from another library becomes valid once that library is imported")
        return "; ".join(lines)

    def _no_subtraction_message(self, spec, tokens: list[str], namespace: str | None) -> str:
        kept = [t for t in tokens if not t.startswith("-")]
        removed = {t[1:] for t in tokens if t.startswith("-")}
        enabled, _ = self.resolve_with_pending(kept, namespace=namespace)
        explicit = ",".join(sorted(enabled - removed))
        return (
            f"span_groups {_spec_text(spec)!r}: there is no subtraction syntax "
            f"({', '.join('-' + r for r in sorted(removed))}); a spec only unions presets and group names. "
            f"List the groups explicitly instead: {explicit or '(nothing left)'}"
        )


def _tokens(spec: str | Iterable[str] | None) -> list[str]:
    if spec is None:
        return []
    parts = spec.split(",") if isinstance(spec, str) else list(spec)
    return [t for t in (_normalise(p).replace(" ", "") for p in parts) if t]


def _spec_text(spec) -> str:
    return spec if isinstance(spec, str) else ",".join(spec)


REGISTRY = SpanRegistry()
"""The process-wide registry that the shipped namespaces register into at import."""

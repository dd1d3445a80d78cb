"""The transfer-queue (data-plane) client wrapper: one ``rl.data_plane.<op>`` span per operation.

There is one data-plane client per process, shared by callers of very different cardinality (a
batch stage puts once per step, the rollout path once per prompt), and the client cannot see its
caller. So the rollout path marks its region with ``per_prompt_scope()`` and this wrapper consults
it (seed 000, "Per-prompt spans"): outside the scope an op is gated on ``data_plane`` and bucketed
overhead (a ``bucket_scope`` applies as to any leaf); inside it the op is gated on ``per_prompt``
and unbucketed, because rollouts overlap each other and training.

Each span carries ``rl.data_plane.op`` (the span-name suffix), ``rl.data_plane.partition`` when
the call names one, and, set after the inner call returns, ``rl.data_plane.keys`` /
``rl.data_plane.bytes`` where they can be measured and ``rl.data_plane.status``: ``ok``,
``timeout`` (a ``TimeoutError``, or an exception whose class name says Timeout) or ``error``.
The inner call's exception is recorded and re-raised; telemetry never raises into it.

    client = TracedDataPlaneClient(build_data_plane_client())
    client.put(samples, partition="train")               # rl.data_plane.put, data_plane, overhead
    with per_prompt_scope():
        await client.put(group_samples, partition="rollout")   # per_prompt, unbucketed
"""

from __future__ import annotations

import inspect
import logging
import numbers
from collections.abc import Mapping, Sized
from typing import Any, Callable

from nemo_telemetry.instrument import _gate, _scopes
from nemo_telemetry.instrument._primitives import NOOP_SPAN, managed_span
from nemo_telemetry.instrument.span_groups import RLSpanGroup

__all__ = ["DATA_PLANE_OPS", "TracedDataPlaneClient", "data_plane_group", "payload_bytes"]

_log = logging.getLogger("nemo_telemetry")

DATA_PLANE_OPS: tuple[str, ...] = (
    "register", "claim_meta", "get_data", "check_consumption_status", "put", "get", "list_sample_ids",
    "clear", "save_checkpoint", "load_checkpoint", "close",
)
"""The eleven transfer-queue operations; each is a method of the wrapper and a span name suffix."""

OP_KEY = "rl.data_plane.op"
PARTITION_KEY = "rl.data_plane.partition"
KEYS_KEY = "rl.data_plane.keys"
BYTES_KEY = "rl.data_plane.bytes"
STATUS_KEY = "rl.data_plane.status"

_DATA_PLANE = str(RLSpanGroup.DATA_PLANE)
_PER_PROMPT = str(RLSpanGroup.PER_PROMPT)
# Ops whose payload goes in (measured from the call's data argument) and ops whose payload comes back.
_SENDS = frozenset({"put"})
_RECEIVES = frozenset({"get", "get_data", "claim_meta", "list_sample_ids"})
_PARTITION_KWARGS = ("partition", "partition_id")
_DATA_KWARGS = ("data", "samples", "batch", "items")
_MAX_DEPTH = 4  # payload_bytes looks this deep into nested containers

Sizes = Callable[[str, tuple, dict, Any], "tuple[int | None, int | None]"]


def data_plane_group() -> str:
    """The group a data-plane op is gated on here: ``per_prompt`` inside a per-prompt scope, else ``data_plane``."""
    if _scopes.per_prompt_used and _scopes.PER_PROMPT.get():
        return _PER_PROMPT
    return _DATA_PLANE


def payload_bytes(value: Any, _depth: int = 0) -> int | None:
    """Bytes of a payload: buffers by length, arrays/tensors by ``nbytes``, containers summed; None if unknown."""
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    if isinstance(value, memoryview):
        return value.nbytes
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, numbers.Integral) and not isinstance(nbytes, bool):
        return int(nbytes)
    if _depth >= _MAX_DEPTH:
        return None
    if isinstance(value, Mapping):
        items = list(value.values())
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        return None
    total = 0
    for item in items:
        size = payload_bytes(item, _depth + 1)
        if size is None:
            return None
        total += size
    return total


def default_sizes(op: str, args: tuple, kwargs: dict, result: Any) -> tuple[int | None, int | None]:
    """``(keys, bytes)`` of one op: the data argument of a put, the result of a read; None where unknown."""
    if op in _SENDS:
        payload = args[0] if args else next((kwargs[k] for k in _DATA_KWARGS if k in kwargs), None)
    elif op in _RECEIVES:
        payload = result
    else:
        return None, None
    if payload is None or isinstance(payload, (str, bytes, bytearray, memoryview)) or not isinstance(payload, Sized):
        return None, payload_bytes(payload) if payload is not None else None
    return len(payload), payload_bytes(payload)


def _status(exc: BaseException) -> str:
    return "timeout" if isinstance(exc, TimeoutError) or "Timeout" in type(exc).__name__ else "error"


class TracedDataPlaneClient:
    """Wraps a transfer-queue client; its eleven ops (:data:`DATA_PLANE_OPS`) each emit one span.

    ``inner`` is any object with those methods (sync or ``async def``); an op it lacks raises
    ``AttributeError`` as the inner client would. Other attributes pass through unchanged.
    ``sizes(op, args, kwargs, result) -> (keys, bytes)`` replaces :func:`default_sizes` for a
    client whose payloads it cannot measure.
    """

    def __init__(self, inner: Any, *, sizes: Sizes | None = None) -> None:
        self._inner = inner
        self._sizes = sizes or default_sizes

    @property
    def inner(self) -> Any:
        """The wrapped client."""
        return self._inner

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._inner, name)

    def _call(self, op: str, args: tuple, kwargs: dict) -> Any:
        method = getattr(self._inner, op)
        group = data_plane_group()
        if group not in _gate.enabled:
            return method(*args, **kwargs)
        if inspect.iscoroutinefunction(method):
            return self._traced_async(op, group, method, args, kwargs)
        with self._open(op, group, kwargs) as span:
            try:
                result = method(*args, **kwargs)
            except BaseException as exc:
                self._finish(span, op, args, kwargs, None, exc)
                raise
            self._finish(span, op, args, kwargs, result, None)
            return result

    async def _traced_async(self, op: str, group: str, method: Callable, args: tuple, kwargs: dict) -> Any:
        with self._open(op, group, kwargs) as span:
            try:
                result = await method(*args, **kwargs)
            except BaseException as exc:
                self._finish(span, op, args, kwargs, None, exc)
                raise
            self._finish(span, op, args, kwargs, result, None)
            return result

    @staticmethod
    def _open(op: str, group: str, kwargs: dict):
        attributes: dict[str, Any] = {OP_KEY: op}
        partition = next((kwargs[k] for k in _PARTITION_KWARGS if kwargs.get(k) is not None), None)
        if partition is not None:
            attributes[PARTITION_KEY] = str(partition)
        try:
            return managed_span(group, f"rl.data_plane.{op}", **attributes)
        except Exception:
            _log.warning("could not open the rl.data_plane.%s span; the op runs without it", op, exc_info=True)
            return NOOP_SPAN

    def _finish(self, span: Any, op: str, args: tuple, kwargs: dict, result: Any, exc: BaseException | None) -> None:
        if span is None:
            return
        try:
            if exc is not None:
                span.set_attribute(STATUS_KEY, _status(exc))
                return
            keys, size = self._sizes(op, args, kwargs, result)
            if keys is not None:
                span.set_attribute(KEYS_KEY, int(keys))
            if size is not None:
                span.set_attribute(BYTES_KEY, int(size))
            span.set_attribute(STATUS_KEY, "ok")
        except Exception:
            _log.warning("could not measure rl.data_plane.%s; the span keeps what it has", op, exc_info=True)

    # -- the eleven ops ------------------------------------------------------------

    def register(self, *args: Any, **kwargs: Any) -> Any:
        """The inner client's ``register``, inside an ``rl.data_plane.register`` span."""
        return self._call("register", args, kwargs)

    def claim_meta(self, *args: Any, **kwargs: Any) -> Any:
        """The inner client's ``claim_meta``, inside an ``rl.data_plane.claim_meta`` span."""
        return self._call("claim_meta", args, kwargs)

    def get_data(self, *args: Any, **kwargs: Any) -> Any:
        """The inner client's ``get_data``, inside an ``rl.data_plane.get_data`` span."""
        return self._call("get_data", args, kwargs)

    def check_consumption_status(self, *args: Any, **kwargs: Any) -> Any:
        """The inner client's ``check_consumption_status``, inside an ``rl.data_plane.check_consumption_status`` span."""
        return self._call("check_consumption_status", args, kwargs)

    def put(self, *args: Any, **kwargs: Any) -> Any:
        """The inner client's ``put``, inside an ``rl.data_plane.put`` span."""
        return self._call("put", args, kwargs)

    def get(self, *args: Any, **kwargs: Any) -> Any:
        """The inner client's ``get``, inside an ``rl.data_plane.get`` span."""
        return self._call("get", args, kwargs)

    def list_sample_ids(self, *args: Any, **kwargs: Any) -> Any:
        """The inner client's ``list_sample_ids``, inside an ``rl.data_plane.list_sample_ids`` span."""
        return self._call("list_sample_ids", args, kwargs)

    def clear(self, *args: Any, **kwargs: Any) -> Any:
        """The inner client's ``clear``, inside an ``rl.data_plane.clear`` span."""
        return self._call("clear", args, kwargs)

    def save_checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """The inner client's ``save_checkpoint``, inside an ``rl.data_plane.save_checkpoint`` span."""
        return self._call("save_checkpoint", args, kwargs)

    def load_checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """The inner client's ``load_checkpoint``, inside an ``rl.data_plane.load_checkpoint`` span."""
        return self._call("load_checkpoint", args, kwargs)

    def close(self, *args: Any, **kwargs: Any) -> Any:
        """The inner client's ``close``, inside an ``rl.data_plane.close`` span."""
        return self._call("close", args, kwargs)

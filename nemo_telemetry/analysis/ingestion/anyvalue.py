"""The one encoding of an OTLP ``AnyValue`` as the string the tables store, for every signal
(span, event, link and resource attributes; metric point attributes; log attributes and bodies)
and both wire forms (OTLP/JSON objects and protobuf messages).

The encoding (``model/schema.py``): strings as they are, ints in decimal, doubles as Python's
``repr``, bools ``true``/``false`` (a JSON bool given as the text "true" counts), bytes as
lowercase hex, arrays and key-value lists as compact JSON with non-ASCII kept as it is. Arrays
and key-value lists nest at most ``MAX_VALUE_DEPTH`` deep: past it ``ValueError``, so that what
holds the value (a request, a record) is rejected and named. Each form is first turned into the
same Python value, and :func:`value_to_string` encodes that: the rule is written once.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

__all__ = [
    "MAX_VALUE_DEPTH",
    "value_to_string",
    "json_flag",
    "json_value_to_python",
    "json_value_string",
    "proto_value_to_python",
    "proto_value_string",
]

# Arrays and key-value lists nested in one attribute value, at most: well inside upb's limit
# of 100 nested messages (a span's attribute value starts 6 deep), so both decoders of each
# format draw the line at the same place.
MAX_VALUE_DEPTH = 32

_EMPTY: dict = {}


def value_to_string(value: Any) -> str | None:
    """The tables' string for a Python value made from an ``AnyValue`` (None stays None)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        return str(value)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=True)


def _too_deep() -> ValueError:
    return ValueError(f"an attribute value nested more than {MAX_VALUE_DEPTH} deep")


def json_flag(flag: Any) -> bool:
    """An OTLP/JSON ``boolValue``: a JSON bool, or text that says ``true`` (any case)."""
    return flag if isinstance(flag, bool) else str(flag).lower() == "true"


def json_value_to_python(value: dict | None, depth: int = 0) -> Any:
    """An OTLP/JSON ``AnyValue`` object as a Python value (bytes, base64 in JSON, as lowercase hex)."""
    if depth > MAX_VALUE_DEPTH:
        raise _too_deep()
    if not value:
        return None
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        return _json_int(value["intValue"])
    if "boolValue" in value:
        return json_flag(value["boolValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "bytesValue" in value:
        return _base64_hex(value["bytesValue"])
    if "arrayValue" in value:
        return [json_value_to_python(v, depth + 1) for v in (value["arrayValue"] or _EMPTY).get("values") or ()]
    if "kvlistValue" in value:
        kvs = (value["kvlistValue"] or _EMPTY).get("values") or ()
        return {kv["key"]: json_value_to_python(kv.get("value"), depth + 1) for kv in kvs}
    return None


_INT64 = 1 << 63
_EXACT_DOUBLE = 1 << 53  # a JSON number parsed as a double is an exact integer below this


def _json_int(value: Any) -> int:
    """An OTLP/JSON ``intValue``: an int64 as a JSON number or a string of ASCII digits. Never
    rounded: 1.5, "1.5", true or a number past int64 is ``ValueError`` (its owner is rejected)."""
    if type(value) is float and value.is_integer() and abs(value) < _EXACT_DOUBLE:
        value = int(value)
    elif type(value) is str and value.isascii() and value.lstrip("-").isdigit() and len(value) <= 20:
        value = int(value)
    if type(value) is not int:
        text = repr(value)
        raise ValueError(f"intValue {text if len(text) <= 40 else text[:37] + '...'} is not an integer")
    if not -_INT64 <= value < _INT64:
        raise ValueError(f"intValue {value} does not fit in int64")
    return value


def json_value_string(value: dict | None) -> str | None:
    """An OTLP/JSON ``AnyValue`` object as the tables' string."""
    return value_to_string(json_value_to_python(value))


def proto_value_to_python(value, depth: int = 0) -> Any:
    """A protobuf ``AnyValue`` message as the Python value :func:`json_value_to_python` gives
    for the same value in JSON."""
    which = value.WhichOneof("value")
    if which is None:
        return None
    if depth > MAX_VALUE_DEPTH:
        raise _too_deep()
    if which == "bytes_value":
        return value.bytes_value.hex()
    if which == "array_value":
        return [proto_value_to_python(v, depth + 1) for v in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: proto_value_to_python(kv.value, depth + 1) for kv in value.kvlist_value.values}
    return getattr(value, which)


def proto_value_string(value) -> str | None:
    """A protobuf ``AnyValue`` message as the tables' string (a string value without a copy)."""
    if value.WhichOneof("value") == "string_value":
        return value.string_value
    return value_to_string(proto_value_to_python(value))


def _base64_hex(text: str) -> str:
    try:
        return base64.b64decode(text, validate=True).hex()
    except (binascii.Error, ValueError):
        return str(text).lower()

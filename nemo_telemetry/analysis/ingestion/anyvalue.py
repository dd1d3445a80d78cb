"""The one encoding of an OTLP ``AnyValue`` as the string the tables store, for every signal
(span, event, link and resource attributes; metric point attributes; log attributes and bodies)
and both wire forms (OTLP/JSON objects and protobuf messages).

The encoding (``model/schema.py``): strings as they are, ints in decimal, doubles as Python's
``repr``, bools ``true``/``false`` (a JSON bool given as the text "true" counts), bytes as
lowercase hex, arrays and key-value lists as compact JSON with non-ASCII kept as it is. Arrays
and key-value lists nest at most ``MAX_VALUE_DEPTH`` deep: past it ``ValueError``, so that what
holds the value (a request, a record) is rejected and named. Each form is first turned into the
same Python value, and :func:`value_to_string` encodes that: the rule is written once.

Beside the string, each value's OTLP type (``model/schema.py``'s ``TYPE_TAGS``): None for a string
(or no value), else the type's name, or for an array or key-value list whose compact JSON does not
give every nested value back (bytes inside, a key repeated) its whole OTLP/JSON ``AnyValue``.
:func:`typed_value` is the way back: the canonical OTLP/JSON ``AnyValue`` of a stored string and
its tag, as :mod:`nemo_telemetry.analysis.export` writes it.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from typing import Any

__all__ = [
    "MAX_VALUE_DEPTH",
    "value_to_string",
    "json_flag",
    "json_value_to_python",
    "json_value_string",
    "proto_value_to_python",
    "proto_value_string",
    "json_value_type",
    "proto_value_type",
    "typed_value",
    "canonical_json_value",
    "python_to_json_value",
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


_JSON_TAGS = {"intValue": "int", "doubleValue": "double", "boolValue": "bool", "bytesValue": "bytes"}
_PROTO_TAGS = {"int_value": "int", "double_value": "double", "bool_value": "bool", "bytes_value": "bytes"}


def json_value_type(value: dict | None) -> str | None:
    """The type tag of an OTLP/JSON ``AnyValue`` (None for a string or no value)."""
    if not value or "stringValue" in value:
        return None
    for key, tag in _JSON_TAGS.items():
        if key in value:
            return tag
    if "arrayValue" in value or "kvlistValue" in value:
        return _composite_tag(canonical_json_value(value), json_value_to_python(value))
    return None


def proto_value_type(value) -> str | None:
    """The type tag of a protobuf ``AnyValue`` (None for a string or no value)."""
    which = value.WhichOneof("value")
    if which is None or which == "string_value":
        return None
    tag = _PROTO_TAGS.get(which)
    if tag is not None:
        return tag
    return _composite_tag(_proto_canonical(value), proto_value_to_python(value))


def _composite_tag(canonical: dict, python: Any) -> str:
    """``array``/``kvlist`` when the compact JSON of ``python`` gives ``canonical`` back, else the
    canonical ``AnyValue`` itself as JSON text."""
    if python_to_json_value(python) == canonical:
        return "array" if "arrayValue" in canonical else "kvlist"
    return json.dumps(canonical, separators=(",", ":"), ensure_ascii=False)


def _double(number: float) -> float | str:
    """A double as OTLP/JSON writes it: a number, or "NaN" / "Infinity" / "-Infinity"."""
    if math.isfinite(number):
        return number
    return "NaN" if math.isnan(number) else ("Infinity" if number > 0 else "-Infinity")


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _values(items: list) -> dict:
    return {"values": items} if items else {}


def python_to_json_value(value: Any) -> dict:
    """The canonical OTLP/JSON ``AnyValue`` of a Python value as :func:`json_value_to_python`
    gives it (a str is a string: bytes are not told apart here)."""
    if value is None:
        return {}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": _double(value)}
    if isinstance(value, list):
        return {"arrayValue": _values([python_to_json_value(v) for v in value])}
    if isinstance(value, dict):
        return {"kvlistValue": _values([{"key": k, "value": python_to_json_value(v)} for k, v in value.items()])}
    raise TypeError(f"no AnyValue for {type(value).__name__}")


def canonical_json_value(value: dict | None, depth: int = 0) -> dict:
    """An OTLP/JSON ``AnyValue`` as one spelling: int64 as a decimal string, doubles as numbers
    (non-finite ones as their names), bytes as standard base64, empty lists left out."""
    if depth > MAX_VALUE_DEPTH:
        raise _too_deep()
    if not value:
        return {}
    if "stringValue" in value:
        return {"stringValue": value["stringValue"]}
    if "intValue" in value:
        return {"intValue": str(_json_int(value["intValue"]))}
    if "boolValue" in value:
        return {"boolValue": json_flag(value["boolValue"])}
    if "doubleValue" in value:
        return {"doubleValue": _double(float(value["doubleValue"]))}
    if "bytesValue" in value:
        return {"bytesValue": _b64(bytes.fromhex(_base64_hex(value["bytesValue"])))}
    if "arrayValue" in value:
        items = (value["arrayValue"] or _EMPTY).get("values") or ()
        return {"arrayValue": _values([canonical_json_value(v, depth + 1) for v in items])}
    if "kvlistValue" in value:
        kvs = (value["kvlistValue"] or _EMPTY).get("values") or ()
        return {"kvlistValue": _values([{"key": kv["key"], "value": canonical_json_value(kv.get("value"), depth + 1)}
                                        for kv in kvs])}
    return {}


def _proto_canonical(value, depth: int = 0) -> dict:
    """:func:`canonical_json_value` of a protobuf ``AnyValue``."""
    if depth > MAX_VALUE_DEPTH:
        raise _too_deep()
    which = value.WhichOneof("value")
    if which is None:
        return {}
    if which == "string_value":
        return {"stringValue": value.string_value}
    if which == "int_value":
        return {"intValue": str(value.int_value)}
    if which == "bool_value":
        return {"boolValue": value.bool_value}
    if which == "double_value":
        return {"doubleValue": _double(value.double_value)}
    if which == "bytes_value":
        return {"bytesValue": _b64(value.bytes_value)}
    if which == "array_value":
        return {"arrayValue": _values([_proto_canonical(v, depth + 1) for v in value.array_value.values])}
    return {"kvlistValue": _values([{"key": kv.key, "value": _proto_canonical(kv.value, depth + 1)}
                                    for kv in value.kvlist_value.values])}


def typed_value(text: str | None, tag: str | None) -> dict:
    """The canonical OTLP/JSON ``AnyValue`` of a stored string ``text`` and its type ``tag``."""
    if tag is not None and tag.startswith("{"):
        return json.loads(tag)
    if text is None:
        return {}
    if tag is None or tag == "string":
        return {"stringValue": text}
    if tag == "int":
        return {"intValue": str(int(text))}
    if tag == "double":
        return {"doubleValue": _double(float(text))}
    if tag == "bool":
        return {"boolValue": text == "true"}
    if tag == "bytes":
        return {"bytesValue": _b64(bytes.fromhex(text))}
    if tag in ("array", "kvlist"):
        return python_to_json_value(json.loads(text))
    raise ValueError(f"unknown attribute type tag {tag!r}")

"""The ``attribute_types`` map the compiled promote passes write beside the attribute map is the
one the Arrow reference (``_promote.type_map``) builds, on random attributes: every value kind,
keys given twice, integer-column values from ints, from strings of digits and from neither, and
owners without attributes."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from nemo_telemetry.analysis.ingestion._promote import (
    AttributeRecords,
    TypeTags,
    promote_arrow,
    promote_records_with_types,
    promote_with_types,
    type_map,
)
from nemo_telemetry.analysis.kernels import compiled
from nemo_telemetry.analysis.model.schema import ITERATION, PROMOTED_SPAN_ATTRIBUTES

# Tests of the compiled kernels: they take them on these small inputs too, as auto would not.
pytestmark = pytest.mark.usefixtures("compiled_kernels")

KEYS = [ITERATION, "rl.bucket", "rl.span_group", "other", "rl.iteration ", "n"]
STRING, BOOL, INT, SPECIAL = 1, 2, 3, 16  # the record kinds, as the protobuf walk numbers them
RARE = [("2.0", "double"), ("0512", "bytes"), ("[1,2]", "array"), ('{"a":1}', "kvlist"), ("", "bytes")]


def random_attributes(rng: np.random.Generator, owners: int):
    """Per owner a list of (key, kind, value, schema string, tag)."""
    out = []
    for _ in range(owners):
        attributes = []
        for _ in range(int(rng.integers(0, 6))):
            key = KEYS[int(rng.integers(len(KEYS)))]
            choice = int(rng.integers(8))
            if choice == 0:
                number = int(rng.integers(-50, 50))
                attributes.append((key, STRING, str(number), str(number), None))  # digits in a string
            elif choice == 1:
                word = ["productive", "x", "", "+5", "007"][int(rng.integers(5))]
                attributes.append((key, STRING, word, word, None))
            elif choice in (2, 3):
                number = int(rng.choice([0, 7, -3, 10**18 - 1, 10**18, -(2**63)]))
                attributes.append((key, INT, number, str(number), "int"))
            elif choice == 4:
                flag = bool(rng.integers(2))
                attributes.append((key, BOOL, int(flag), "true" if flag else "false", "bool"))
            elif choice == 5:
                text, tag = RARE[int(rng.integers(len(RARE)))]
                attributes.append((key, SPECIAL, text, text, tag))
            else:
                attributes.append((key, -1, None, None, None))  # no value
        out.append(attributes)
    return out


def records_of(owners: list) -> AttributeRecords:
    """The attributes as the protobuf walk records them: keys and string values in one buffer."""
    flat = [a for attributes in owners for a in attributes]
    buffer = bytearray()
    key_start, key_length, kind, value, length = [], [], [], [], []
    special = []
    for key, k, v, _, _ in flat:
        key_start.append(len(buffer))
        key_length.append(len(key.encode()))
        buffer += key.encode()
        if k == STRING:
            kind.append(k)
            value.append(len(buffer))
            length.append(len(v.encode()))
            buffer += v.encode()
        elif k == SPECIAL:
            kind.append(SPECIAL + len(special))
            special.append(v.encode())
            value.append(0)
            length.append(0)
        else:
            kind.append(k)
            value.append(v if v is not None else 0)
            length.append(0)
    special_offsets = np.zeros(len(special) + 1, dtype=np.int64)
    np.cumsum([len(s) for s in special], out=special_offsets[1:])
    data = np.frombuffer(bytes(buffer), dtype=np.uint8)

    def strings():
        return pa.array([a[0] for a in flat], pa.string()), pa.array([a[3] for a in flat], pa.string())

    as_int64 = lambda xs: np.array(xs, dtype=np.int64)  # noqa: E731
    return AttributeRecords(
        data, as_int64(key_start), as_int64(key_length), as_int64(kind), as_int64(value), as_int64(length),
        special_offsets, np.frombuffer(b"".join(special), dtype=np.uint8), (STRING, BOOL, INT, SPECIAL), strings,
    )


def reference(counts, keys, values, tags: TypeTags, owners: int) -> list:
    _, columns = promote_arrow(counts, keys, values, owners, PROMOTED_SPAN_ATTRIBUTES)
    keys_of = lambda rows: keys.take(pa.array(rows))  # noqa: E731
    return type_map(counts, owners, tags.array(), keys_of, {ITERATION: columns[ITERATION]}).to_pylist()


@pytest.mark.parametrize("seed", range(6))
def test_the_compiled_type_maps_equal_the_arrow_reference(seed):
    rng = np.random.default_rng(seed)
    owners = random_attributes(rng, 300)
    flat = [a for attributes in owners for a in attributes]
    counts = np.array([len(a) for a in owners], dtype=np.int64)
    keys = pa.array([a[0] for a in flat], pa.string())
    values = pa.array([a[3] for a in flat], pa.string())
    tags = TypeTags.of(pa.array([a[4] for a in flat], pa.string()))
    expected = reference(counts, keys, values, tags, len(owners))

    attributes, columns, types = promote_with_types(counts, keys, values, len(owners), PROMOTED_SPAN_ATTRIBUTES, tags)
    assert types.to_pylist() == expected
    records = promote_records_with_types(counts, records_of(owners), len(owners), PROMOTED_SPAN_ATTRIBUTES, tags)
    assert records[2].to_pylist() == expected
    assert records[0].to_pylist() == attributes.to_pylist()
    # the cases the map must tell apart occur: an int in the integer column (no entry), digits
    # from a string in it (tagged "string"), and tags of every kind
    entries = [entry for owner in expected for entry in owner]
    assert (ITERATION, "string") in entries and (ITERATION, "int") in entries
    assert {tag for _, tag in entries} >= {"int", "bool", "double", "bytes", "array", "kvlist", "string"}
    assert any(value is not None for value in columns[ITERATION].to_pylist())
    assert not compiled.broken()  # the kernels wrote them, not the reference taking over


def test_an_int_in_its_column_has_no_entry_and_digits_from_a_string_are_tagged_string():
    owners = [
        [(ITERATION, INT, 5, "5", "int"), ("n", INT, 1, "1", "int")],
        [(ITERATION, STRING, "5", "5", None)],
        [(ITERATION, INT, 10**18, str(10**18), "int")],  # too long for the column: stays, tagged
        [("rl.bucket", INT, 4, "4", "int")],  # a string column keeps the int's tag
        [],
    ]
    flat = [a for attributes in owners for a in attributes]
    counts = np.array([len(a) for a in owners], dtype=np.int64)
    tags = TypeTags.of(pa.array([a[4] for a in flat], pa.string()))
    want = [[("n", "int")], [(ITERATION, "string")], [(ITERATION, "int")], [("rl.bucket", "int")], []]
    keys = pa.array([a[0] for a in flat], pa.string())
    values = pa.array([a[3] for a in flat], pa.string())
    assert reference(counts, keys, values, tags, len(owners)) == want
    assert promote_with_types(counts, keys, values, len(owners), PROMOTED_SPAN_ATTRIBUTES, tags)[2].to_pylist() == want
    by_records = promote_records_with_types(counts, records_of(owners), len(owners), PROMOTED_SPAN_ATTRIBUTES, tags)
    assert by_records[2].to_pylist() == want
    assert not compiled.broken()

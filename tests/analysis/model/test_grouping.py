"""The rules' group-by helper (``model/grouping.py``) against plain Python over random keys: narrow
keys (grouped through a code table), wide ones (sorted), uint64 ids past 2**63, negative codes."""

from __future__ import annotations

import numpy as np
import pytest

from nemo_telemetry.analysis.model.grouping import find_keys, first_rows, group_by, string_codes

KEYS = {
    "narrow": lambda rng, n: (rng.integers(-1, 3, n), rng.integers(0, 5, n)),
    "wide": lambda rng, n: (rng.integers(-1, 2, n), rng.integers(-(1 << 40), 1 << 40, n)),
    "ids": lambda rng, n: (rng.integers(0, 2, n).astype(bool),
                           rng.choice(np.array([1, 7, (1 << 63) + 5, (1 << 64) - 1], np.uint64), n)),
}


@pytest.mark.parametrize("kind", KEYS)
@pytest.mark.parametrize("seed", range(5))
def test_groups_are_numbered_in_key_order_with_their_first_row(kind, seed):
    rng = np.random.default_rng(seed)
    keys = KEYS[kind](rng, int(rng.integers(1, 200)))
    rows = list(zip(*(k.tolist() for k in keys)))
    distinct = sorted(set(rows))
    groups = group_by(*keys)
    assert groups.codes.tolist() == [distinct.index(r) for r in rows]
    assert groups.first.tolist() == [rows.index(d) for d in distinct]
    values = rng.integers(0, 100, len(rows))
    assert groups.reduce(np.add, values).tolist() == [sum(v for r, v in zip(rows, values) if r == d) for d in distinct]
    assert groups.size().tolist() == [rows.count(d) for d in distinct]
    assert [m.tolist() for m in groups.members()] == [[i for i, r in enumerate(rows) if r == d] for d in distinct]
    assert first_rows(*keys).tolist() == sorted(rows.index(d) for d in distinct)


@pytest.mark.parametrize("kind", KEYS)
def test_find_keys_gives_each_wanted_keys_position_or_minus_one(kind):
    rng = np.random.default_rng(1)
    keys = KEYS[kind](rng, 60)
    distinct = first_rows(*keys)
    index = tuple(k[distinct[::2]] for k in keys)
    rows = list(zip(*(k.tolist() for k in index)))
    wanted = KEYS[kind](rng, 40)
    expected = [rows.index(w) if w in rows else -1 for w in zip(*(k.tolist() for k in wanted))]
    assert find_keys(index, wanted).tolist() == expected


def test_string_codes_number_first_appearances_or_a_given_order_and_none_is_minus_one():
    values = np.array(["b", None, "a", "b"], dtype=object)
    assert [c.tolist() if hasattr(c, "tolist") else c for c in string_codes(values)] == [[0, -1, 1, 0], ("b", "a")]
    codes, order = string_codes(["b", "c", None], ("a", "b"))
    assert codes.tolist() == [1, -1, -1] and order == ("a", "b")

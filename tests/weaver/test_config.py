"""`weaving: {enabled, ratio}`: defaults, shorthands, and refusals that name the field."""

from __future__ import annotations

import pytest
import yaml

from medusa.weaver.config import WeavingConfig, parse_weaving


def test_entries_parse_from_yaml():
    doc = yaml.safe_load("""
models:
  hot: {weaving: {enabled: true, ratio: 0.3}}
  warm: {weaving: {ratio: 1}}
  plain: {}
  flag: {weaving: true}
""")["models"]  # fmt: skip
    got = {m: parse_weaving(v.get("weaving"), m) for m, v in doc.items()}
    assert got["hot"] == WeavingConfig(True, 0.3)
    assert got["warm"] == WeavingConfig(True, 1.0)
    assert got["plain"] == WeavingConfig(False, 0.45)
    assert got["flag"] == WeavingConfig(True, 0.45)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"ratio": 0}, r"models.m.weaving.ratio: 0 is outside \(0, 1\].*enabled: false"),
        ({"ratio": 1.5}, r"ratio: 1.5 is outside"),
        ({"ratio": "half"}, r"ratio: expected a number"),
        ({"ratio": True}, r"ratio: expected a number"),
        ({"enabled": "yes"}, r"enabled: expected true or false"),
        ({"ratoi": 0.4}, r"unknown field\(s\) \['ratoi'\]"),
        ([0.45], r"expected a mapping"),
    ],
)
def test_bad_entries_are_refused_naming_the_field(value, message):
    with pytest.raises(ValueError, match=message):
        parse_weaving(value, "m")

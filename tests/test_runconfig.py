"""|V| read from a run's config by one rule, whichever room asks (ingest's detectors, the run
page's reference line, alerts replay)."""
from __future__ import annotations

import math

import pytest

from forksight.base.runconfig import vocab_size_of


@pytest.mark.parametrize("config, expected", [
    ({"vocab_size": 151936}, 151936),
    ('{"vocab_size": 311, "lr": 0.001}', 311),          # stored JSON text
    ({"vocab_size": 311.0}, 311),
    ({"vocab_size": 1}, None),                          # log 1 = 0: bounds nothing
    ({"vocab_size": True}, None), ({"vocab_size": "311"}, None), ({"vocab_size": math.inf}, None),
    ({}, None), (None, None), ("not json", None), ([1, 2], None),
])
def test_vocab_size_of_a_config(config, expected):
    assert vocab_size_of(config) == expected


def test_the_rooms_read_the_same_rule(tmp_path):
    from forksight.dashboard.run_view import vocab_size

    assert vocab_size({"config": '{"vocab_size": 97}'}) == 97 == vocab_size_of({"vocab_size": 97})
    assert vocab_size({"config": {"vocab_size": 0}}) is None and vocab_size(None) is None

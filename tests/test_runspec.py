"""RunSpec: one frozen, validated description of a run, built at the door and handed down whole."""
from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from forksight.base.limits import MAX_RANK, MAX_SHORT_CHARS
from forksight.base.runspec import RunSpec


def test_defaults_are_the_old_keyword_defaults_and_the_create_body_leaves_unset_fields_out():
    spec = RunSpec(name="exp")
    assert (spec.project, spec.strategy, spec.model, spec.config) == ("default", None, None, None)
    assert (spec.rank, spec.stop_on_alert, spec.resume, spec.token) == (0, False, False, None)
    assert spec.create_body() == {"name": "exp", "project": "default"}
    full = RunSpec(name="exp", strategy="fork", model="tiny", config={"vocab_size": 311}, rank=2, token="t")
    assert full.create_body() == {"name": "exp", "project": "default", "strategy": "fork", "model": "tiny",
                                  "config": {"vocab_size": 311}}      # rank, token, flags are not run fields


def test_frozen_and_the_token_never_shows_in_its_repr():
    spec = RunSpec(name="exp", token="s3cret-token")
    with pytest.raises(ValidationError, match="frozen"):
        spec.name = "other"
    assert "s3cret" not in repr(spec) and "s3cret" not in str(spec)


@pytest.mark.parametrize("fields, field", [
    ({"name": "run\n"}, "name"),                     # '$' would let a trailing newline through
    ({"name": "-x"}, "name"),
    ({"name": "a" * 129}, "name"),
    ({"name": "ok", "project": "p" * (MAX_SHORT_CHARS + 1)}, "project"),
    ({"name": "ok", "rank": -1}, "rank"),
    ({"name": "ok", "rank": MAX_RANK + 1}, "rank"),
    ({"name": "ok", "config": {"lr": math.nan}}, "config"),
    ({"name": "ok", "config": {"bad": "\ud800"}}, "config"),
    ({"name": "ok", "projetc": "typo"}, "projetc"),
])
def test_bad_fields_are_refused_naming_the_field(fields, field):
    with pytest.raises(ValidationError) as err:
        RunSpec(**fields)
    assert field in str(err.value)


def test_the_door_turns_a_name_into_the_nearest_valid_id_and_a_spec_into_a_validated_copy(caplog):
    assert RunSpec.of("/tmp/out dir/run 1").name == "tmp-out-dir-run-1"      # TRL's default: the output dir
    assert "not a valid run id" in caplog.text
    assert RunSpec.of("///").name == "run"
    spec = RunSpec.of("exp", project="p", rank=1)
    assert RunSpec.of(spec) is spec
    moved = RunSpec.of(spec, rank=0, resume=True)
    assert (moved.name, moved.project, moved.rank, moved.resume) == ("exp", "p", 0, True)
    assert (spec.rank, spec.resume) == (1, False)                              # the original is untouched
    with pytest.raises(ValidationError, match="rank"):
        spec.replace(rank=-3)                                                  # a copy is validated too


def test_fields_given_as_none_leave_the_spec_alone_and_filled_only_fills_what_is_unset():
    spec = RunSpec(name="exp", project="p", model="mine", config={"lr": 0.1, "vocab_size": 7})
    assert RunSpec.of(spec, project=None, config=None) is spec
    filled = spec.filled(strategy="trl-grpo", model="from-trainer", config={"vocab_size": 311, "beta": 0.0})
    assert (filled.strategy, filled.model) == ("trl-grpo", "mine")            # the spec's own value wins
    assert filled.config == {"vocab_size": 7, "beta": 0.0, "lr": 0.1}          # defaults under the spec's keys
    bare = RunSpec(name="exp").filled(model="tiny", config={"vocab_size": 311})
    assert (bare.model, bare.config) == ("tiny", {"vocab_size": 311})

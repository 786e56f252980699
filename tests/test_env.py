"""The bearer token: the one given, else $FORKSIGHT_TOKEN — the collector and the sinks agree."""
from __future__ import annotations

from forksight.base.env import TOKEN_VAR, token_or_env
from forksight.monitor.sinks.transport import bearer


def test_the_token_given_wins_then_the_environment_then_none(monkeypatch):
    monkeypatch.delenv(TOKEN_VAR, raising=False)
    assert token_or_env(None) is None and bearer(None) == {}
    monkeypatch.setenv(TOKEN_VAR, "")
    assert token_or_env(None) is None                      # empty means unset
    monkeypatch.setenv(TOKEN_VAR, "from-env")
    assert token_or_env(None) == "from-env" and token_or_env("given") == "given"
    assert bearer(None) == {"Authorization": "Bearer from-env"}
    assert bearer("given") == {"Authorization": "Bearer given"}

"""The environment variables forksight reads that more than one room needs, each read here only."""
from __future__ import annotations

import os

TOKEN_VAR = "FORKSIGHT_TOKEN"


def token_or_env(token: str | None = None) -> str | None:
    """The bearer token given, else $FORKSIGHT_TOKEN, else None (an empty value counts as none):
    the collector requires it, the sinks send it."""
    return token or os.environ.get(TOKEN_VAR) or None

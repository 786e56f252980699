"""The lake's one error type: what went wrong and what to do, said at start or by `forksight lake`."""
from __future__ import annotations


class LakeError(RuntimeError):
    """A lake that cannot be used as configured (bad URI, unreachable catalog, incompatible table)."""

"""`forksight.verl`: attach to verl runs with no change to the user's code (needs the `verl` extra).

Installed as a `verl.plugins` entry point, so `import verl` loads it in every Ray process; add
`forksight` to `trainer.logger`. Importing this module only registers post-import hooks; the
integration lives in `forksight.hooks.integrations.verl` and `forksight.hooks.integrations.verl_install`.
"""
from forksight.hooks.integrations.verl_install import SUPPORT, check_version, install, supported, verl_version

__all__ = ["SUPPORT", "check_version", "install", "supported", "verl_version", "ForksightLogger"]

install()


def __getattr__(name: str):
    if name == "ForksightLogger":         # imports numpy and the sink: only when asked for
        from forksight.hooks.integrations.verl import ForksightLogger

        return ForksightLogger
    raise AttributeError(f"module 'forksight.verl' has no attribute {name!r}")

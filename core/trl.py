"""`forksight.trl.attach(trainer, ...)`: TRL's GRPOTrainer in one line (needs the `trl` extra).

The integration lives in `forksight.hooks.integrations.trl`; this module is its public name.
"""
from forksight.hooks.integrations.trl import SUPPORT, ForksightCallback, trl_mode
from forksight.hooks.integrations.trl_reference import attach   # plus probe_every=N and reference_every=N

__all__ = ["attach", "ForksightCallback", "SUPPORT", "trl_mode"]

"""forksight.trainer: the bundled selective-RLVR trainer (GRPO/DAPO with token selection)."""

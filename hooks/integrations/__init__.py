"""forksight.hooks.integrations: the trainers people already run (TRL's GRPOTrainer, verl)."""

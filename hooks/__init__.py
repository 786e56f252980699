"""forksight.hooks: the producers' room. Per-token math (`metrics`), forward hooks on any
PyTorch model (`attach`), TRL's GRPOTrainer (`trl`) and the per-step reporter (`report`).
Public entry points are re-exported by `forksight` itself."""

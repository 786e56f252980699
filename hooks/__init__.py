"""forksight.hooks: forward hooks that compute per-token statistics in any PyTorch/TRL run."""

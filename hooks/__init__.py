"""forksight.hooks, the producers' room in data-path order: `metrics` (the per-token math:
token_stats, passk, token_select, summary), `capture` (forward hooks → statistics → step buffer →
report; `attach`), `integrations` (TRL, verl). Public entry points are re-exported by `forksight`."""

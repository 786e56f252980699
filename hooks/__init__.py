"""forksight.hooks: the producers' room, in data-path order. Per-token math (`metrics`: token_stats,
passk, token_select, summary); `attach` = capture (hooks) → forward_stats → step_buffer → report,
with sample_log for rewards; integrations `trl` (+ trl_rows) and `verl`. Public entry points are
re-exported by `forksight` itself."""

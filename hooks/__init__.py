"""forksight.hooks, the producers' room in data-path order: per-token math (`metrics` = token_stats,
passk, token_select, summary); `attach` = capture → forward_stats → step_buffer → report (+ sample_log);
integrations `trl` (+ trl_rows) and `verl`. Public entry points are re-exported by `forksight`."""

"""forksight.dashboard: the Dash app served by the collector at `/`."""

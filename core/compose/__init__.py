"""forksight.compose, the composition root: the ASGI app (collector + dashboard), the CLI and
the commands that wire rooms together (serve, demo, alerts replay). The only place that
imports every room; no room imports it."""

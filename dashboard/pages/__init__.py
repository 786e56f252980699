"""Dashboard pages: each module has `layout` and `register(app)` (page + its callbacks)."""

"""Reading a serialised Dash layout (the JSON of /_dash-layout) in tests."""
from __future__ import annotations


def find_props(tree, component_id: str) -> dict | None:
    """The props of the component with this id in a serialised Dash layout, or None."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("props", {}).get("id") == component_id:
                return node["props"]
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return None

"""The node (`node.py`) and its training components, each owning its state (see node.py's docstring).

Imports `trust/`, `net/` and `ops/` of the runtime; nothing there imports this room.
"""

"""A local swarm of daemon processes on one machine (`swarm.py`) and its fork server (`zygote.py`).

The top room: it may import every other one.
"""

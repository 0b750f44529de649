"""Operations: start-up errors, the state directory's lock, the control socket, metrics, events, logs, loop lag.

Nothing here knows a peer; every other room may import it.
"""

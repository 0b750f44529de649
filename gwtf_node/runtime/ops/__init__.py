"""Operations: start-up errors, the state directory's lock, the control socket, metrics, events, logs, loop lag,
the C heap's free pages given back.

Nothing here knows a peer; every other room may import it.
"""

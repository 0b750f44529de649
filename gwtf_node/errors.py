"""What an exception holds: its causes, contexts and the members of exception groups, walked without imports.

`entry.py` reads it before the command line is imported (a Ctrl-C that Python
wrapped in another exception is still a Ctrl-C), and the network code reads
it to find why a connection failed under py-libp2p's wrappers
(runtime/net/conninfo.py, bootstrap.py).
"""

from __future__ import annotations


def exception_chain(exc: BaseException) -> list[BaseException]:
    """`exc` and every exception inside it: causes, contexts and the members of exception groups."""
    seen: set[int] = set()
    chain: list[BaseException] = []

    def walk(e: BaseException | None) -> None:
        if e is None or id(e) in seen:
            return
        seen.add(id(e))
        chain.append(e)
        for sub in getattr(e, "exceptions", None) or getattr(e, "errors", None) or ():
            if isinstance(sub, BaseException):
                walk(sub)
        walk(e.__cause__)
        walk(e.__context__)

    walk(exc)
    return chain


__all__ = ["exception_chain"]

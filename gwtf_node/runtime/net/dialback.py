"""Reachability by dial-back: does anyone outside reach this node at its public address?

A node whose advertised addresses are all private is behind NAT and needs a
relay (relay.py `looks_natted`).  A node with a public address may still be
unreachable: a firewall, or a host firewall of its own, drops connections
from outside, and nothing in its addresses says so.  py-libp2p's AutoNAT does
not tell either (it never dials back: it calls any port at the caller's
address reachable; ../shared/notes/py-libp2p-nat.md), so the check is ours:

* the node asks a peer it dialled (`check`) over `DIALBACK_PROTOCOL_ID`:
  "dial my port P";
* the peer (`serve`) opens a *new* TCP connection to P at the address the
  request came from (never another address: the check cannot be turned
  against a third party), closes it, and answers `ok` or `no <why>`;
* `ok`: reachable.  `no`: the node reserves a slot on its relays and
  advertises only its relayed addresses (relay.py), as a node behind NAT does.

One answer decides (the first peer that speaks the protocol); a peer that
does not (an older node) is skipped and the next one met is asked.
"""

from __future__ import annotations

import logging

import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

log = logging.getLogger("gwtf.transport")

DIALBACK_PROTOCOL_ID = TProtocol("/gwtf/dialback/1.0.0")
DIALBACK_TIMEOUT_S = 5.0  # the dialling peer gives a connection this long (a dropped SYN is retried within it)
ANSWER_TIMEOUT_S = 15.0  # the asking node waits this long for the answer
MAX_LINE = 64


async def _read_line(stream) -> bytes:
    buf = b""
    while not buf.endswith(b"\n") and len(buf) < MAX_LINE:
        chunk = await stream.read(MAX_LINE - len(buf))
        if not chunk:
            break
        buf += chunk
    return buf.strip()


async def _close(stream) -> None:
    with trio.move_on_after(1):
        try:
            await stream.close()
        except Exception:  # noqa: BLE001 - closing a stream the other side may have closed
            pass


async def serve(stream) -> None:
    """Answer a dial-back request: connect to the asked port at the asker's own address."""
    try:
        with trio.fail_after(ANSWER_TIMEOUT_S):
            remote = stream.get_remote_address()
            line = await _read_line(stream)
            try:
                port = int(line)
                if not 0 < port < 65536:
                    raise ValueError
            except ValueError:
                await stream.write(b"no bad request\n")
                return
            if remote is None:
                await stream.write(b"no remote address unknown\n")
                return
            answer = b"ok\n"
            try:
                with trio.fail_after(DIALBACK_TIMEOUT_S):
                    conn = await trio.open_tcp_stream(remote[0], port)
                await conn.aclose()
            except (OSError, trio.TooSlowError) as e:
                answer = f"no {remote[0]}:{port}: {type(e).__name__}\n".encode()
            await stream.write(answer)
    except Exception as e:  # noqa: BLE001 - a broken or slow request costs the asker its answer, nothing else
        log.debug("dial-back request failed: %r", e)
    finally:
        await _close(stream)


async def check(lp, peer_id: str, port: int) -> bool | None:
    """Ask `peer_id` to dial this node's `port`: True (reached), False (not), None (no answer: ask another)."""
    try:
        with trio.fail_after(ANSWER_TIMEOUT_S):
            stream = await lp.new_stream(ID.from_base58(peer_id), [DIALBACK_PROTOCOL_ID])
            try:
                await stream.write(f"{port}\n".encode())
                answer = await _read_line(stream)
            finally:
                await _close(stream)
    except Exception as e:  # noqa: BLE001 - the peer does not speak the protocol, or it broke: ask another
        log.debug("dial-back by %s: no answer (%r)", peer_id, e)
        return None
    if answer == b"ok":
        return True
    if answer.startswith(b"no"):
        log.warning("dial-back by %s failed (%s): this node is not reachable at its public address",
                    peer_id, answer[3:].decode(errors="replace"))
        return False
    return None


__all__ = ["DIALBACK_PROTOCOL_ID", "check", "serve"]

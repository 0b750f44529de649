"""The run owner's commands: `admit`, `revoke`, `peer-id`; and the owner key of `init-run`.

The owner key is an Ed25519 key in its own file (`owner.key` next to the
manifest unless `--owner-key` says otherwise; mode 0600; never inside the
manifest).  `init-run` creates it, or reuses the file given, and signs the
manifest with it; `admit` signs a certificate for one peer id and role;
`revoke` signs the run's revocation list (the peers given plus those of the
previous list in the same file) and can store it in the DHT of a running
swarm (`--publish-to`), where every node reads it (certificates.py).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from .. import ctrlc
from .common import CliError, _manifest_error_types

PUBLISH_ATTEMPTS = 3  # each bounded by host.DHT_QUERY_TIMEOUT_S: a busy swarm answers a store late


def owner_key_path(run: str | Path, given: str | None) -> Path:
    return Path(given) if given else Path(run).resolve().parent / "owner.key"


def sign_run(man, run_path: str | Path, owner_key: str | None):
    """`man` owned and signed by the key at `--owner-key` (default: owner.key beside the manifest), created if
    absent; the key's path and whether it was created."""
    from ..model.certificates import load_or_create_owner_key
    from ..model.manifest import sign_manifest

    path = owner_key_path(run_path, owner_key)
    try:
        key, created = load_or_create_owner_key(path)
    except ValueError as e:
        raise CliError(str(e)) from None
    except OSError as e:
        raise CliError(f"cannot write the owner key {path}: {e.strerror}") from None
    return sign_manifest(man, key), path, created


def _owned_run(args: argparse.Namespace):
    """The signed manifest of `--run` and the owner key that signed it (the one at `--owner-key`)."""
    from ..model.certificates import load_owner_key, public_key_hex
    from ..model.manifest import load_manifest, verify_manifest

    try:
        man = load_manifest(args.run)
        verify_manifest(man)
    except _manifest_error_types() as e:
        raise CliError(str(e)) from None
    if not man.owner_public_key:
        raise CliError(f"{args.run} is not signed by an owner: nobody can admit nodes to it (sign it: init-run)")
    path = owner_key_path(args.run, args.owner_key)
    try:
        key = load_owner_key(path)
    except ValueError as e:
        raise CliError(str(e)) from None
    if public_key_hex(key) != man.owner_public_key:
        raise CliError(f"the key {path} is not the owner key of {args.run} (its public key differs): give the "
                       "key that signed it with --owner-key")
    return man, key


def cmd_admit(args: argparse.Namespace) -> int:
    from ..model.certificates import CERTIFICATE_FILE, issue_certificate, parse_expiry

    man, key = _owned_run(args)
    _check_peer_id(args.peer_id)
    try:
        expires = parse_expiry(args.expires, time.time()) if args.expires else 0
    except ValueError as e:
        raise CliError(str(e)) from None
    cert = issue_certificate(key, man.run_id, args.peer_id, args.role, expires)
    out = Path(args.out or CERTIFICATE_FILE)
    try:
        out.write_text(cert.to_json() + "\n")
    except OSError as e:
        raise CliError(f"cannot write {out}: {e.strerror}") from None
    until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires)) if expires else "no expiry"
    print(f"wrote {out}: {args.role} node {args.peer_id} admitted to run {man.run_id} ({until}); "
          f"the node joins with --certificate {out} (or keeps it as {CERTIFICATE_FILE} in its state directory)")
    return 0


def cmd_revoke(args: argparse.Namespace) -> int:
    from ..model.certificates import AdmissionError, check_revocations, sign_revocations

    man, key = _owned_run(args)
    for pid in args.peer_id:
        _check_peer_id(pid)
    out = Path(args.out) if args.out else Path(args.run).resolve().parent / "revoked.json"
    peers = set(args.peer_id)
    issued = int(time.time())
    if out.exists():  # the list grows: a revocation is not undone by revoking someone else
        try:
            old = check_revocations(out.read_bytes(), owner_public_key=man.owner_public_key, run_id=man.run_id)
        except AdmissionError as e:
            raise CliError(f"{out}: {e} (move it away to start a new list)") from None
        peers |= set(old.peer_ids)
        issued = max(issued, old.issued + 1)
    rl = sign_revocations(key, man.run_id, peers, issued)
    try:
        out.write_bytes(rl.to_bytes() + b"\n")
    except OSError as e:
        raise CliError(f"cannot write {out}: {e.strerror}") from None
    print(f"wrote {out}: {len(rl.peer_ids)} peer(s) revoked from run {man.run_id}; nodes read it with "
          f"--revocations {out}, or from the DHT (--publish-to)")
    if args.publish_to:
        _publish(args.publish_to, man.run_id, rl.to_bytes().decode())
        print(f"published in the DHT of the swarm at {args.publish_to}: run/{man.run_id}/revoked")
    return 0


def _publish(addr: str, run_id: str, value: str) -> None:
    import tempfile

    import trio

    from ..runtime.net.host import PeerUnreachable, open_host
    from ..runtime.trust.records import put_signed

    if "/p2p/" not in addr:
        raise CliError(f"--publish-to {addr!r} must be a multiaddr ending in /p2p/<peer id>")

    async def go() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            async with open_host(Path(tmp), bootstrap=[addr]) as host:
                try:
                    await host.connect(addr)
                except PeerUnreachable as e:
                    raise CliError(f"--publish-to {addr}: {e}") from None
                await host.refresh_dht()  # learn the swarm's peers beyond the one dialled: the record goes to them
                for attempt in range(PUBLISH_ATTEMPTS):
                    try:
                        await put_signed(host, f"run/{run_id}/revoked", value)
                        return
                    except trio.TooSlowError:
                        if attempt == PUBLISH_ATTEMPTS - 1:
                            raise CliError(f"--publish-to {addr}: the DHT did not store the list within "
                                           f"{PUBLISH_ATTEMPTS} attempts; give the file to the nodes "
                                           "(--revocations) or try again") from None

    ctrlc.hand_over()
    trio.run(go, restrict_keyboard_interrupt_to_checkpoints=True)


def cmd_peer_id(args: argparse.Namespace) -> int:
    from ..runtime.net.identity import IdentityError, load_or_create_identity, peer_id_of

    try:
        print(peer_id_of(load_or_create_identity(Path(args.state_dir))))
    except IdentityError as e:
        raise CliError(str(e)) from None
    except OSError as e:
        raise CliError(f"cannot create the identity key in {args.state_dir}: {e.strerror}") from None
    return 0


def _check_peer_id(pid: str) -> None:
    import multihash
    from libp2p.peer.id import ID

    try:
        multihash.decode(ID.from_base58(pid).to_bytes())  # base58 of a multihash (identity or sha2-256)
    except Exception:  # base58 and multihash raise several types for a malformed id
        raise CliError(f"--peer-id {pid!r} is not a libp2p peer id (the node prints its own: "
                       "gwtf-node peer-id --state-dir DIR)") from None


def add_owner_parsers(sub) -> None:
    ad = sub.add_parser("admit", help="the run owner admits one node: writes its certificate")
    ad.add_argument("--run", required=True, help="the signed run manifest")
    ad.add_argument("--peer-id", required=True, help="the node's peer id (gwtf-node peer-id --state-dir DIR)")
    ad.add_argument("--role", choices=("data", "relay"), required=True)
    ad.add_argument("--expires", default=None, metavar="ISO8601|DURATION",
                    help="when the admission ends: 2027-01-31T12:00:00+00:00, or 90m, 12h, 30d, 2w (default: never)")
    ad.add_argument("--owner-key", default=None, help="the owner key (default: owner.key beside the manifest)")
    ad.add_argument("--out", default=None, help="where to write the certificate (default: certificate.json)")
    ad.set_defaults(func=cmd_admit)

    rv = sub.add_parser("revoke", help="the run owner takes admissions back: a signed revocation list")
    rv.add_argument("--run", required=True, help="the signed run manifest")
    rv.add_argument("--peer-id", required=True, action="append", help="a peer id to revoke (repeatable)")
    rv.add_argument("--owner-key", default=None, help="the owner key (default: owner.key beside the manifest)")
    rv.add_argument("--out", default=None, help="the revocation list file (default: revoked.json beside the "
                                                "manifest; peers already in it stay revoked)")
    rv.add_argument("--publish-to", default=None, metavar="MULTIADDR",
                    help="store the list in the DHT of the swarm reached at this address (run/<id>/revoked)")
    rv.set_defaults(func=cmd_revoke)

    pi = sub.add_parser("peer-id", help="print a node's peer id (creating its identity key if missing)")
    pi.add_argument("--state-dir", default="gwtf-state", help="the node's state directory")
    pi.set_defaults(func=cmd_peer_id)

"""The node's long-lived identity: an Ed25519 key pair kept in the state directory.

The libp2p peer id is derived from the public key, so keeping the key file is
what lets a restarted node come back under the same peer id (peers, DHT
records and scenario link tables keep pointing at it).  The file
`<state_dir>/identity.key` holds the 32-byte Ed25519 seed behind a short
magic header, written atomically (temp file + rename) with mode 0600; the
state directory is created with mode 0700 when missing.  A file that is not a
key we wrote raises `IdentityError` with the path and what to do: never a
silent new identity, which would quietly turn the node into a stranger.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ...model.certificates import write_private_file

from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.keys import KeyPair
from libp2p.peer.id import ID

KEY_FILE_NAME = "identity.key"
_MAGIC = b"gwtf-ed25519-v1\n"  # header of the key file: format and version
_SEED_BYTES = 32  # an Ed25519 private key is its 32-byte seed


class IdentityError(RuntimeError):
    """The identity key file exists but cannot be used."""


def key_path(state_dir: Path) -> Path:
    return Path(state_dir) / KEY_FILE_NAME


def load_or_create_identity(state_dir: Path) -> KeyPair:
    """The key pair stored in `state_dir`, created (0600) on first use."""
    state_dir = Path(state_dir)
    path = key_path(state_dir)
    if path.exists():
        return _load(path)
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    seed = os.urandom(_SEED_BYTES)
    write_private_file(path, _MAGIC + seed)
    return create_new_key_pair(seed)


def _load(path: Path) -> KeyPair:
    data = path.read_bytes()
    if len(data) != len(_MAGIC) + _SEED_BYTES or not data.startswith(_MAGIC):
        raise IdentityError(
            f"identity key file {path} is corrupt or not a gwtf-node key "
            f"({len(data)} bytes, expected {len(_MAGIC) + _SEED_BYTES} starting with {_MAGIC!r}); "
            "restore it from a backup to keep this node's peer id, or delete it to start "
            "under a new peer id"
        )
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        os.chmod(path, 0o600)  # tighten silently: the key must stay private
    return create_new_key_pair(data[len(_MAGIC):])


def peer_id_of(key_pair: KeyPair) -> str:
    return ID.from_pubkey(key_pair.public_key).to_base58()


__all__ = ["IdentityError", "KEY_FILE_NAME", "key_path", "load_or_create_identity", "peer_id_of"]

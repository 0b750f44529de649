"""Checkpoints in the state directory: written atomically, the last few kept, read back with clear errors.

Layout of a state directory's checkpoints:

    checkpoints/step-00000012.pt   one file per checkpoint, named by the optimizer steps its state holds
    checkpoint.pt                  a hard link to the newest (what tools and tests read)

A file is a `torch.save` of a dict: `format` (FORMAT), `run_id`, `role`
("data" | "relay"), `stage` (a relay's stage; None for a data node's
embedding and head), `steps` (optimizer steps applied to the state),
`state` (the part's `state_bytes()`: parameters and optimizer state, stored
as a 1-D uint8 tensor over those bytes; a file holding them as a `bytes`
object reads the same), `sha256` of `state`, `params_sha256` (`StageModel.state_hash()`: the same
on every copy of a stage holding the same weights, so a node can compare its
checkpoint with a stage peer's live state without moving the state), and
`params` (the flat parameter vector, for tests and tools).

Writing: to a temporary file in the same directory, flushed and fsynced,
then renamed over the final name, so a crash leaves either the old or the
new file, never half of one.  `write` runs in a worker thread, and nothing in
it holds the GIL for long: the state goes in as a tensor, whose bytes torch
copies into the file with the GIL released (pickled as `bytes`, hundreds of MB
were copied and CRC'd in one call holding the GIL, and the node's event loop,
which answers its peers' pings, stood still meanwhile: looplag.py).  `keep` (KEEP by default) newest files are
kept; older ones are removed after the new one is in place.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("gwtf.node")

FORMAT = "gwtf-checkpoint/1"
KEEP = 3
DIR = "checkpoints"
LATEST = "checkpoint.pt"
_NAME = re.compile(r"^step-(\d{8,})\.pt$")


class CheckpointError(Exception):
    """A checkpoint file that cannot be used; the message says which file and why."""


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    run_id: str
    role: str  # "data" | "relay"
    stage: int | None  # a relay's stage; None: a data node's embedding and head
    steps: int  # optimizer steps applied to `state`
    state: bytes  # StageModel.state_bytes()
    sha256: str  # of `state`
    params_sha256: str  # StageModel.state_hash() of the weights in `state`

    def describe(self) -> str:
        part = "data node part" if self.stage is None else f"stage {self.stage}"
        return f"{part} after {self.steps} steps ({self.path})"


def write(state_dir: Path, *, run_id: str, role: str, stage: int | None, steps: int, state: bytes,
          params_sha256: str, params=None, keep: int = KEEP) -> Path:
    """Write a checkpoint of `steps` steps atomically, point `checkpoint.pt` at it, keep the newest `keep`."""
    import torch

    d = Path(state_dir) / DIR
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"step-{steps:08d}.pt"
    tmp = d / f".{path.name}.{os.getpid()}.tmp"
    with warnings.catch_warnings():  # (torch warns that `bytes` are not writable: the tensor is only read)
        warnings.simplefilter("ignore", UserWarning)
        blob = torch.frombuffer(state, dtype=torch.uint8) if len(state) else torch.empty(0, dtype=torch.uint8)
    rec = {"format": FORMAT, "run_id": run_id, "role": role, "stage": stage, "steps": int(steps), "state": blob,
           "sha256": hashlib.sha256(state).hexdigest(), "params_sha256": params_sha256, "params": params}
    try:
        torch.save(rec, str(tmp))  # (a path: torch writes the file itself, the GIL released)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except RuntimeError as e:  # torch's writer reports a failed write (a full disk) as a RuntimeError
        tmp.unlink(missing_ok=True)  # (leave no partial file behind)
        import errno
        import shutil

        free = shutil.disk_usage(d).free
        why = "no space left on device" if free < len(state) else f"write failed: {str(e).splitlines()[0]}"
        raise OSError(errno.ENOSPC if free < len(state) else errno.EIO, f"{why} ({free // 1024} KiB free)",
                      str(path)) from None
    except BaseException:
        tmp.unlink(missing_ok=True)  # (leave no partial file behind)
        raise
    latest = Path(state_dir) / LATEST
    link_tmp = Path(state_dir) / f".{LATEST}.{os.getpid()}.tmp"
    try:
        link_tmp.unlink(missing_ok=True)
        os.link(path, link_tmp)
        os.replace(link_tmp, latest)
    except OSError:  # a file system without hard links: a copy, also renamed into place
        import shutil

        shutil.copyfile(path, link_tmp)
        os.replace(link_tmp, latest)
    _fsync_dir(d)
    for old in listing(state_dir)[keep:]:
        try:
            old.unlink()
        except OSError as e:
            log.warning("could not remove old checkpoint %s: %s", old, e)
    return path


def listing(state_dir: Path) -> list[Path]:
    """The checkpoint files of a state directory, newest (most steps) first."""
    d = Path(state_dir) / DIR
    if not d.is_dir():
        return []
    found = [(int(mt.group(1)), p) for p in d.iterdir() if (mt := _NAME.match(p.name))]
    return [p for _steps, p in sorted(found, reverse=True)]


def load_error(e: BaseException) -> str:
    """What a failed `torch.load(..., weights_only=True)` says, in one line.  A file holding objects other than
    tensors and plain values is refused as such: torch's own message advises `weights_only=False`, which would
    run the code a file from elsewhere may carry."""
    text = str(e).strip()
    if "Weights only load failed" in text or "weights_only" in text:
        return "it holds objects other than tensors and plain values, refused: loading them could run code"
    first = (text.splitlines() or [""])[0]  # (torch's messages run over several lines)
    return f"{type(e).__name__}: {first}"


def load(path: Path, *, run_id: str | None = None) -> Checkpoint:
    """Read one checkpoint file; CheckpointError says what is wrong with it."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        rec = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises several unrelated types for a corrupt archive
        raise CheckpointError(f"{path}: not a readable checkpoint ({load_error(e)})") from None
    if not isinstance(rec, dict) or rec.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a gwtf-node checkpoint (format {FORMAT} expected)")
    try:
        state = rec["state"]
        if isinstance(state, torch.Tensor):
            if state.dtype != torch.uint8 or state.dim() != 1:
                raise TypeError(f"state is a {state.dtype} tensor of shape {tuple(state.shape)}, not bytes")
            state = state.numpy().tobytes()
        ck = Checkpoint(path, str(rec["run_id"]), str(rec["role"]), None if rec["stage"] is None else int(rec["stage"]),
                        int(rec["steps"]), bytes(state), str(rec["sha256"]), str(rec["params_sha256"]))
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: checkpoint field missing or malformed ({e})") from None
    if hashlib.sha256(ck.state).hexdigest() != ck.sha256:
        raise CheckpointError(f"{path}: checkpoint state does not match its sha256 (corrupted)")
    if run_id is not None and ck.run_id != run_id:
        raise CheckpointError(f"{path}: checkpoint of run {ck.run_id}, this node trains run {run_id}")
    return ck


def newest(state_dir: Path, *, run_id: str | None = None) -> Checkpoint | None:
    """The newest usable checkpoint of a state directory (unusable files are logged and skipped)."""
    for path in listing(state_dir):
        try:
            return load(path, run_id=run_id)
        except CheckpointError as e:
            log.warning("skipping checkpoint: %s", e)
    return None


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)

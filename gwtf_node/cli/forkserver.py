"""The program of the local swarm's fork server: `python -m gwtf_node.cli.forkserver`.

It imports what every node imports first (torch, the model classes of
transformers, libp2p, trio, the daemon and the stage executor), once, then
serves the launcher (runtime/local/zygote.py `serve`): each child it forks runs the
command line's `main` with the node's arguments.  The imports below are the
point of the module: a child finds them done.
"""

from __future__ import annotations

import sys

import libp2p  # noqa: F401 - imported once, for every child
import torch  # noqa: F401
import transformers.masking_utils  # noqa: F401
import transformers.models.gpt2.modeling_gpt2  # noqa: F401
import transformers.models.llama.modeling_llama  # noqa: F401
import trio  # noqa: F401

from ..model import stages  # noqa: F401
from ..runtime.node import node  # noqa: F401
from ..runtime.local.zygote import serve
from . import main

if __name__ == "__main__":
    sys.exit(serve(main))

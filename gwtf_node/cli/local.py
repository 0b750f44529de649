"""What `gwtf-node local` shows and leaves behind while its swarm (runtime/local/swarm.py) runs.

* Where: the workdir is printed first, on stderr (also with `--json`, whose
  stdout carries only the per-iteration records), and again at the end, on an
  error, and on Ctrl-C.
* While the swarm starts, the progress bar's label says what the launcher
  waits for (nodes starting, meeting, flows forming, training); with `--json`
  each phase is one line on stderr.  The bar's clock starts with training and
  the bar closes at the last iteration, so its rate counts neither start-up
  nor the swarm's teardown.
* What stays: `iterations.jsonl` and `loss.png` (the run's loss curve) in the
  workdir.  The nodes' state directories (checkpoints, identity keys, node
  logs, status files: the bulk, about 3 MB per relay of the default model)
  are removed once the swarm has stopped, after a finished or an interrupted
  run, unless `--keep`; after an error they are always kept, for their logs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .common import CliError

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a process stopped by Ctrl-C


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run_swarm(swarm, man, args: argparse.Namespace) -> int:
    """Run `swarm` (a runtime.local.LocalSwarm) for `args.iterations`, showing progress; the exit status."""
    from ..runtime.local.swarm import LocalError, run_local

    workdir: Path = swarm.workdir
    _err(f"gwtf-node local: workdir {workdir}: {args.data_nodes} data node(s), {len(man.stages)} stages x "
         f"{args.relays_per_stage} relays, {man.model.family} model, {args.iterations} iterations")
    bar = None
    if not args.json:
        from tqdm import tqdm
        bar = tqdm(total=args.iterations, unit="it", file=sys.stderr)
    training = [False]

    def phase(text: str) -> None:
        if bar is None:
            _err(f"gwtf-node local: {text}")
            return
        if bar.n >= args.iterations:  # the bar is closed: its figures stay those of training
            _err(f"gwtf-node local: {text}")
            return
        bar.set_description_str(text, refresh=False)
        if text.startswith("training") and not training[0]:
            training[0] = True
            bar.reset(total=args.iterations)  # the rate counts training only, not the start-up
        else:
            bar.refresh()

    def show(rec: dict) -> None:
        if args.json:
            print(json.dumps(rec), flush=True)
            return
        tput = rec["samples"] / rec["seconds"] if rec["seconds"] else 0.0
        bar.set_postfix(loss=f"{rec['loss']:.4f}", mb=rec["microbatches"], samples_s=f"{tput:.1f}", refresh=False)
        bar.update(1)
        if bar.n >= args.iterations:
            bar.set_description_str("done")
            bar.close()  # before the teardown, which the rate must not count

    swarm.on_phase = phase
    records: list[dict] = []
    try:
        run_local(swarm, show, records)
    except LocalError as e:
        if bar is not None:
            bar.close()
        _keep_summary(workdir, records, man)
        raise CliError(f"{e}\n(the workdir {workdir} is kept, with every node's node.log)") from None
    except KeyboardInterrupt:
        if bar is not None:
            bar.close()
        _finish(swarm, records, man, args)
        _err(f"interrupted after {len(records)} iteration(s); workdir {workdir}")
        return EXIT_INTERRUPTED
    if bar is not None:
        bar.close()
    if records and not args.json:
        spent = sum(r["seconds"] for r in records)
        _err(f"done: loss {records[0]['loss']:.4f} -> {records[-1]['loss']:.4f} over {len(records)} iterations, "
             f"{spent:.1f} s of training ({spent / len(records):.2f} s per iteration)")
    if args.churn > 0 and not args.json:
        _err(f"churn: {len(swarm.kills)} relay(s) SIGKILLed and restarted as joiners; microbatches completed "
             f"{sum(r.get('completed', 0) for r in records)}, deferred {sum(r.get('deferred', 0) for r in records)}, "
             f"lost {sum(r.get('lost', 0) for r in records)}")
    _finish(swarm, records, man, args)
    return 0


def _keep_summary(workdir: Path, records: list[dict], man) -> list[Path]:
    from ..runtime.local.swarm import write_summary

    try:
        return write_summary(workdir, records, f"gwtf-node local: {man.model.family} model, {len(man.stages)} stages")
    except OSError as e:
        _err(f"warning: cannot write the run's summary into {workdir}: {e.strerror}")
        return []


def _finish(swarm, records: list[dict], man, args: argparse.Namespace) -> None:
    """Leave the summary in the workdir, remove the nodes' state directories unless --keep, say what stays."""
    written = _keep_summary(swarm.workdir, records, man)
    if args.keep:
        _err(f"workdir {swarm.workdir}: kept whole (node logs, checkpoints, status files)"
             + (f"; loss plot {swarm.workdir / 'loss.png'}" if records else ""))
        return
    swarm.remove_state_dirs()
    names = ", ".join(p.name for p in written) or "run.json"
    _err(f"workdir {swarm.workdir}: {names} (the nodes' state directories are removed; --keep keeps them)")

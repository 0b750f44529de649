"""Helpers for the tests that kill a relay and start it again with its state directory.

`stage_plan` reads what each iteration trained from the nodes' logs: the data
part on the microbatches the data nodes completed ("iteration t settled:
completed [...]"), each relay stage on the contributions its relays announced
for the all-reduce round that summed them ("iteration t: round KEY:
contributions [...]", logged at DEBUG: the swarms of these tests run at
`log_level="DEBUG"`, and "summed in round KEY", every log of every relay of
the stage, the logs of earlier lives of a restarted relay included).
`reference_run` trains the centralized reference on a plan, stage by stage: a
stage that counted no contribution in an iteration takes no step, as in the
swarm.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from gwtf_node.model.reference import build_chain, make_sources
from gwtf_node.runtime.local.swarm import LocalSwarm

Key = tuple[int, int]  # (data node index, seq)


def relay_logs(workdir: Path, name: str) -> str:
    """Every life's log of a relay: node.log.N (earlier lives, renamed before a restart) and node.log."""
    d = workdir / name
    older = sorted(d.glob("node.log.*"), key=lambda p: int(p.suffix[1:]))
    return "".join(p.read_text(errors="replace") for p in older + [d / "node.log"] if p.exists())


def stage_plan(workdir: Path, data_nodes: int, relays: dict[int, list[str]]) -> list[tuple[list[Key], dict[int, list[Key]]]]:
    """Per iteration: (the data part's keys, stage -> the keys its relays counted)."""
    names = [f"d{i}" for i in range(data_nodes)]
    # a relay names a data node by its name, or by the first 16 characters of its peer id while it does not know
    # the name (Peers.who: e.g. back after a restart, before the data node's Hello)
    index = {n: int(n[1:]) for n in names}
    for n in names:
        index[(workdir / n / "addr").read_text().split()[0].rsplit("/", 1)[-1][:16]] = int(n[1:])
    settled: dict[int, list[Key]] = {}
    for n in names:
        text = (workdir / n / "node.log").read_text(errors="replace")
        for it, seqs in re.findall(r"iteration (\d+) settled: completed (\[[^]]*\])", text):
            settled.setdefault(int(it), []).extend((int(n[1:]), s) for s in json.loads(seqs))
    # a stage's sum of an iteration: the contributions every member announced for the all-reduce round that summed
    # them (a member killed after that round completed still counts; a round redone without it does not)
    counted: dict[int, dict[int, list[Key]]] = {}
    for k, names_k in relays.items():
        announced: dict[tuple[int, str], list[Key]] = {}
        summed: set[tuple[int, str]] = set()
        for r in names_k:
            text = relay_logs(workdir, r)
            mine: dict[tuple[int, str], set[Key]] = {}  # (a round announced again, or the log's "repeated" line, once)
            for it, gkey, keys in re.findall(r"iteration (\d+): round (\S+): contributions (\[.*?\]\])", text):
                mine.setdefault((int(it), gkey), set()).update((index[w], s) for w, s in json.loads(keys))
            for ig, keys in mine.items():
                announced.setdefault(ig, []).extend(keys)
            summed |= {(int(it), gkey) for it, gkey in re.findall(r"iteration (\d+): summed in round ([^\s:]+)", text)}
        for it, gkey in summed:
            counted.setdefault(it, {}).setdefault(k, []).extend(announced.get((it, gkey), []))
    return [(sorted(settled[t]), {k: sorted(v) for k, v in counted.get(t, {}).items()}) for t in sorted(settled)]


def reference_losses(man, data_nodes: int, plan) -> list[float | None]:
    """Centralized losses of `plan` (`stage_plan`); None for an iteration that completed no microbatch."""
    return reference_run(man, data_nodes, plan)[0]


def reference_run(man, data_nodes: int, plan):
    """Centralized training of `plan`, a list of (the data part's keys, stage -> its keys) per iteration:
    (the losses, None for an iteration that completed no microbatch; each relay stage's final parameters; the
    data part's final parameters)."""
    data, relays = build_chain(man)
    sources = make_sources(man, data_nodes)
    losses: list[float | None] = []
    for data_keys, stage_keys in plan:
        batch = []
        every = set(data_keys).union(*[set(v) for v in stage_keys.values()])
        for key in sorted(every):
            x, y = sources[key[0]].get(key[1])
            h = data.embed(key, x)
            for r in relays:
                h = r.forward(key, h)
            loss, g = data.head_loss(key, h, y, hold=True)
            for k in reversed(range(len(relays))):
                g = relays[k].backward(key, g, hold=True)
                if key not in stage_keys.get(k, []):
                    relays[k].discard(key)
            if key in data_keys:
                data.count_held(key)
                data.embed_backward(key, g)
                batch.append(loss)
            else:
                data.discard(key)
                data.drop(key)
        data.apply_mean_grad(data.grad_vector(), len(data_keys))
        for k, r in enumerate(relays):  # (in the order a relay adds what it holds: its keys sorted)
            r.commit_many(stage_keys.get(k, []))
            r.apply_mean_grad(r.grad_vector(), len(stage_keys.get(k, [])))
        losses.append(sum(batch) / len(batch) if batch else None)
    return losses, [r.param_vector() for r in relays], data.param_vector()


def two_data_nodes(workdir: Path, iterations: int, microbatches: int) -> tuple:
    """(the manifest, a LocalSwarm not started yet) of 2 data nodes and 2 stages x 1 relay, the default model
    with `microbatches` per data node and iteration."""
    from gwtf_node.model.manifest import default_manifest, save_manifest

    man = default_manifest(stages=2, seq_len=16, microbatch_size=2, microbatches_per_iteration=microbatches)
    run = workdir / "run.json"
    save_manifest(man, run)
    return man, LocalSwarm(workdir, run, data_nodes=2, stages=2, relays_per_stage=1, iterations=iterations,
                           log_level="DEBUG")


def restart(swarm: LocalSwarm, name: str, *, auto: bool = False) -> None:
    """Start relay `name` again with the same state directory and flags (`--stage auto` if `auto`, else the
    stage its name says); its earlier log is kept aside, its fault disarmed."""
    d = swarm.state_dir(name)
    lives = len(list(d.glob("node.log.*")))
    if (d / "node.log").exists():
        os.replace(d / "node.log", d / f"node.log.{lives}")
    (d / "fault").unlink(missing_ok=True)
    swarm.faults.pop(name, None)
    boot = (swarm.state_dir("d0") / "addr").read_text().split()[0]
    saved, swarm.auto_stage = swarm.auto_stage, auto
    try:
        swarm._spawn(name, boot, None)
    finally:
        swarm.auto_stage = saved
    swarm.expected_dead.discard(name)


def common_checkpoint_params(workdir: Path, a: str, b: str):
    """(steps, params of a, params of b) at the most steps both state directories hold a checkpoint of."""
    import torch

    from gwtf_node.runtime.node.checkpoints import listing

    def by_steps(name: str) -> dict[int, Path]:
        return {int(p.stem.split("-")[1]): p for p in listing(workdir / name)}

    sa, sb = by_steps(a), by_steps(b)
    common = sorted(set(sa) & set(sb))
    assert common, (a, sorted(sa), b, sorted(sb))
    n = common[-1]
    return n, torch.load(sa[n], weights_only=False)["params"], torch.load(sb[n], weights_only=False)["params"]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` (/proc/<pid>/stat, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_share(pid: int, wall_s: float) -> float:
    """The share of wall time process `pid` spends on a CPU over the next `wall_s` seconds (blocking)."""
    c0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(wall_s)
    return (cpu_seconds(pid) - c0) / (time.monotonic() - t0)

"""The timing priors of the recovery machine: what a node expects before it measured anything.

A hand-off deadline is `K x est(peer) x (1 + waiting) + MARGIN_S` and the
data node's watchdog `K_E2E x e2e_est + MARGIN_S` (module docstrings of relay.py
and rounds.py); `est` and `e2e_est` are EWMAs of measured times, and these
functions give their first values.  The daemon (`runtime/node/microbatches.py`)
and the simulator (`sim/train/`) both call them, with what a node knows when
its machine starts or a neighbour appears: the cost d(i, j) of Equation 1
without compute (latency plus the transfer of one activation, in ms), which
the daemon measures for its flow machine and the simulator reads from its
links.

* Hand-off -> Complete: the transfer over the link plus HOP_PRIOR_S for the
  peer's compute and queueing.  A fixed prior alone (1 s) is right on a LAN
  but not where an activation takes 20 s to cross the link (the paper's
  256 MiB over ~100 Mbit/s): every first hand-off would miss its deadline and
  be resent, and the resends would queue behind the transfers they repeat.
* Launch -> final backward: E2E_PRIOR_S plus a forward and a backward over
  every hop of the pipeline, each hop costing the mean of the data node's
  own links (the only ones it knows).

On loopback the transfers are a few ms, so both are the fixed priors.
"""

from __future__ import annotations

from typing import Iterable, Mapping

HOP_PRIOR_S = 1.0  # compute and queueing of a hand-off before anything is measured (then an EWMA)
E2E_PRIOR_S = 3.0  # compute of a whole microbatch, launch -> final backward, before anything is measured


def hop_prior_s(link_cost_ms: float) -> float:
    """Expected hand-off -> Complete time over a link of cost `link_cost_ms` (d(i, j) without compute)."""
    return HOP_PRIOR_S + max(0.0, link_cost_ms) / 1000.0


def hop_priors(link_costs_ms: Mapping[str, float]) -> dict[str, float]:
    """`hop_prior_s` of every peer."""
    return {j: hop_prior_s(c) for j, c in link_costs_ms.items()}


def e2e_prior_s(relay_stages: int, first_link_costs_ms: Iterable[float]) -> float:
    """Expected launch -> final backward time of a data node whose links to the first stage cost
    `first_link_costs_ms`: 2 (S + 1) hops of their mean transfer, plus E2E_PRIOR_S of compute."""
    costs = [max(0.0, c) for c in first_link_costs_ms]
    hop_s = sum(costs) / len(costs) / 1000.0 if costs else 0.0
    return E2E_PRIOR_S + 2 * (relay_stages + 1) * hop_s

"""Simulated annealing acceptance (section V-C of the GWTF paper, after Johnson et al.).

A move that raises the cost by `delta` > 0 is accepted when
exp(-delta / T) > U(0, 1); after each accepted move T <- alpha * T.  Moves
that lower the cost are always accepted.  Below `t_min` the node stops
exploring, so that a converged swarm stops moving flows around.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

T0_DEFAULT = 1.7  # the paper's initial temperature
ALPHA_DEFAULT = 0.95  # the paper's cooling factor
T_MIN_DEFAULT = 0.05  # below this a worse move has p < exp(-20) for unit costs: stop exploring


@dataclass
class Annealer:
    temperature: float = T0_DEFAULT
    alpha: float = ALPHA_DEFAULT
    t_min: float = T_MIN_DEFAULT

    def accepts_worse(self, delta: float, rng: random.Random) -> bool:
        """Whether to take a move that raises the cost by `delta` (> 0)."""
        if self.temperature < self.t_min or delta <= 0:
            return False
        return math.exp(-delta / self.temperature) > rng.random()

    def cool(self) -> None:
        self.temperature *= self.alpha

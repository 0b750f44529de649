"""The tensors of this node's microbatches, per key (data node, seq, iteration), kept and dropped on order.

The recovery machine keeps a record of each microbatch key and no tensor; the
tensors live here, in slots:

* `IN`: the activation received (a relay's stage input; at the sink the last
  stage's output);
* `IN_KEPT`: the indices that activation arrived with when it came Top-K
  sparse (None when it came dense): its gradient goes back at them;
* `OUT`: a relay's stage output, a data node's embedding: what Forward and
  Recover carry, kept for resends and repairs;
* `GRAD_IN`: the gradient received;
* `GRAD_OUT`: the gradient sent upstream, kept for Resume (at the sink the
  loss gradient);
* `TARGET`, `LOSS`: a data node's targets and loss of the microbatch.

The store changes only through the effects it is handed: `Keep` (a tensor
the machine asked a computation on, or a computation's result) and `Drop`
(every slot of a key the machine forgot: done, released, given up,
superseded).  Reading a slot (`get`) leaves it; `take` consumes it (an input
once its computation started).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Iterable


class Slot(enum.Enum):
    IN = "in"
    IN_KEPT = "in_kept"
    OUT = "out"
    GRAD_IN = "grad_in"
    GRAD_OUT = "grad_out"
    TARGET = "target"
    LOSS = "loss"


@dataclass(frozen=True, slots=True)
class Keep:
    key: tuple
    slot: Slot
    value: Any


@dataclass(frozen=True, slots=True)
class Drop:
    """Forget every slot of `key`."""

    key: tuple


class TensorStore:
    def __init__(self) -> None:
        self._slots: dict[Slot, dict[tuple, Any]] = {s: {} for s in Slot}

    def apply(self, effects: Iterable[Keep | Drop]) -> None:
        for e in effects:
            if isinstance(e, Keep):
                self._slots[e.slot][e.key] = e.value
            elif isinstance(e, Drop):
                for store in self._slots.values():
                    store.pop(e.key, None)
            else:
                raise TypeError(f"TensorStore.apply: {e!r} is neither Keep nor Drop")

    def keep(self, key: tuple, slot: Slot, value: Any) -> None:
        self.apply([Keep(key, slot, value)])

    def get(self, key: tuple, slot: Slot) -> Any | None:
        return self._slots[slot].get(key)

    def take(self, key: tuple, slot: Slot) -> Any:
        """The value of a slot, removed (KeyError if the slot is empty)."""
        return self._slots[slot].pop(key)

    def keys(self) -> set[tuple]:
        return {k for store in self._slots.values() for k in store}

    def drops_beside(self, live: Iterable[tuple]) -> list[Drop]:
        """Drop effects for every key held here that is not in `live`."""
        alive = set(live)
        return [Drop(k) for k in sorted(self.keys() - alive, key=repr)]

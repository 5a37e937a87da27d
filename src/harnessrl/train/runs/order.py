"""The order the training tasks are drawn in, and the held-out split for eval, both fixed
by the run's seed so a resumed run draws the same tasks from its checkpoint's cursor on.

Each pass over the tasks (an epoch) is its own shuffle, seeded by (seed, epoch): the n-th
task drawn is a pure function of n, so the cursor alone says where the run is.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class TaskOrder(Generic[T]):
    tasks: Sequence[T]
    seed: int
    _epochs: dict[int, list[int]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ValueError("no tasks to train on")

    def at(self, index: int) -> T:
        """The index-th task drawn (0-based, over every epoch)."""
        epoch, position = divmod(index, len(self.tasks))
        order = self._epochs.get(epoch)
        if order is None:
            order = list(range(len(self.tasks)))
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
            self._epochs = {epoch: order}  # one epoch at a time is all a run reads
        return self.tasks[order[position]]


def split(ids: Sequence[str], share: float, seed: int) -> tuple[list[str], list[str]]:
    """(train, held out): `share` of the ids (at least one, and one left to train on) held
    out by a shuffle seeded by `seed`; each list in the ids' own order."""
    if len(ids) < 2:
        raise ValueError(f"eval: a held-out split needs at least 2 tasks, the set has "
                         f"{len(ids)} (give [eval] tasks, a second task set)")
    count = min(len(ids) - 1, max(1, round(share * len(ids))))
    shuffled = list(ids)
    random.Random(f"{seed}:eval-split").shuffle(shuffled)
    held = set(shuffled[:count])
    return [i for i in ids if i not in held], [i for i in ids if i in held]

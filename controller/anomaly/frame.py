"""One window of one entity kind's signals as a matrix (entities x signals, NaN = not
available): the detector's input, made from hosts' `contract.signals.SignalsDoc` windows or
straight from the simulator's arrays."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from contract.signals import Entity, SignalsDoc, names_of


@dataclass(frozen=True, eq=False)
class SignalFrame:
    """``values[i, j]``: signal ``signals[j]`` of entity ``entities[i]`` (NaN: not
    available). Raises ValueError when the shape does not match the names."""

    kind: Entity
    entities: tuple[str, ...]
    signals: tuple[str, ...]
    values: npt.NDArray[np.float64]

    def __post_init__(self) -> None:
        if self.values.shape != (len(self.entities), len(self.signals)):
            raise ValueError(
                f"frame of {len(self.entities)} entities x {len(self.signals)} signals "
                f"has values of shape {self.values.shape}"
            )
        if len(set(self.entities)) != len(self.entities):
            raise ValueError("an entity appears twice in one frame")


def frame_from_docs(docs: Iterable[SignalsDoc], kind: Entity | str) -> SignalFrame:
    """Return the frame of ``kind`` over the hosts' documents of one window, with the
    catalogue's signals of ``kind`` as columns (a signal a document lacks is NaN). An entity
    reported by two documents keeps the later one's values."""
    ent_kind = Entity(kind)
    names = names_of(ent_kind)
    col = {n: j for j, n in enumerate(names)}
    rows: dict[str, npt.NDArray[np.float64]] = {}
    for doc in docs:
        g = doc.groups.get(ent_kind)
        if g is None:
            continue
        idx = np.array([col[s] for s in g.signals], np.intp)
        for ent, vals in g.values.items():
            row = np.full(len(names), np.nan)
            row[idx] = np.array([np.nan if v is None else v for v in vals], np.float64)
            rows[ent] = row
    ents = tuple(rows)
    values = np.vstack([rows[e] for e in ents]) if ents else np.zeros((0, len(names)))
    return SignalFrame(ent_kind, ents, names, values)

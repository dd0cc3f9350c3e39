"""What a consumer's checkpoint row becomes, the same for both faces: :class:`Checkpoint`, read from a row and
written as parameters (the statements are :mod:`unilog.store._async.checkpoints`', written once for both faces)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Checkpoint:
    """A consumer's progress: the last stream entry it consumed and, per producer, the last (epoch, seq) applied."""

    name: str
    stream: str
    last_id: str = "0-0"
    positions: dict[str, tuple[int, int]] = field(default_factory=dict)

    def copy(self) -> Checkpoint:
        return Checkpoint(self.name, self.stream, self.last_id, dict(self.positions))


def save_params(checkpoint: Checkpoint) -> tuple[str, str, str]:
    """The parameters of the statement that saves ``checkpoint`` (last id, positions as JSON, name)."""
    return checkpoint.last_id, json.dumps({p: list(pos) for p, pos in checkpoint.positions.items()}), checkpoint.name


def checkpoint_from_row(name: str, row: tuple[Any, ...]) -> Checkpoint:
    stream, last_id, positions = row
    if isinstance(positions, str):  # selected as text, or a connection whose jsonb loader gives text (Django's)
        positions = json.loads(positions) if positions != "{}" else {}
    return Checkpoint(name, stream, last_id, {p: (int(e), int(s)) for p, (e, s) in positions.items()})

"""The states of a DataLoader's own objects that keep one (torchdata's
``Stateful`` protocol: ``state_dict()`` and ``load_state_dict()``), asked
where they live: the sampler, batch sampler and their iterator in this
process, as each batch's indices are drawn; a map-style dataset in the
process that makes its batches."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

import torch.utils.data

from ..errors import ConfigError

# NOTE [ Where a user object's state is asked ]
#
# fastq's own state (epoch, batches delivered, seed) is computed, not
# snapshotted. A user's Stateful object is another matter: only it knows
# its state, so it is asked. The samplers live here, and the planner draws
# indices ahead of the batches delivered (the plan table), so their state
# is asked as each batch is drawn and kept, by the number of batches drawn,
# until that batch is delivered: a state saved after k batches holds the
# samplers as they were after drawing k. A map-style dataset lives in the
# workers (a copy in each): each asks its copy after every batch it makes,
# and the state travels in the slot with the batch, so the record is the
# state of each worker's copy as of its last batch delivered. Loaded, worker
# w's copy gets saved worker w's state before its first batch (in this
# process, with num_workers=0, the dataset gets worker 0's), so a resume on
# another number of workers starts the extra copies fresh.


def is_stateful(obj: Any) -> bool:
    """torchdata's Stateful protocol, as its runtime check reads it."""
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    )


def sampler_owners(loader: Any) -> dict[str, Any]:
    """The loader's samplers that keep a state, by the name a state records
    them under. A Stateful batch sampler answers for its sampler; torch's
    own BatchSampler (which keeps none) lets its sampler answer."""
    index = loader._index_sampler
    if loader._auto_collation and index is loader.batch_sampler:
        if is_stateful(index):
            return {"batch_sampler": index}
        if type(index) is not torch.utils.data.BatchSampler:
            return {}
    return {"sampler": loader.sampler} if is_stateful(loader.sampler) else {}


class SamplerStates:
    """An epoch's samplers' states, by the number of its batches drawn
    (NOTE [ Where a user object's state is asked ])."""

    def __init__(self, owners: dict[str, Any]) -> None:
        self.owners = owners
        self.iterator: Any = None  # the index sampler's, when Stateful
        # (batches drawn, the states then), oldest first, from the oldest
        # batch not yet delivered on.
        self._after: deque[tuple[int, dict[str, Any]]] = deque()

    def now(self) -> dict[str, Any]:
        states = {name: obj.state_dict() for name, obj in self.owners.items()}
        if self.iterator is not None:
            states["iterator"] = self.iterator.state_dict()
        return states

    def begin(self, iterator: Any, drawn: int, loaded: dict[str, Any] | None) -> None:
        """The epoch's index iterator, with `drawn` batches of it drawn before
        (a resumed epoch's, whose states were `loaded`)."""
        self.iterator = iterator if is_stateful(iterator) else None
        self._after = deque([(drawn, self.now() if loaded is None else loaded)])

    def at(self, drawn: int) -> dict[str, Any]:
        """The states after `drawn` batches (delivered, so drawn)."""
        for n, states in self._after:
            if n == drawn:
                return states
        raise AssertionError(f"no sampler states after {drawn} batches")

    def forget_before(self, drawn: int) -> None:
        after = self._after
        while len(after) > 1 and after[0][0] < drawn:
            after.popleft()

    def drawing(self, batches: Iterator[Any], drawn: int) -> Iterator[Any]:
        """`batches`, recording the states after each is drawn."""
        after = self._after
        for batch in batches:
            drawn += 1
            after.append((drawn, self.now()))
            yield batch


def load_samplers(owners: dict[str, Any], saved: dict[str, Any]) -> None:
    """Loads each sampler's saved state into it, before its iterator is made;
    a state of samplers this loader does not have is refused."""
    names = set(saved) - {"iterator"}
    if names != set(owners):
        raise ConfigError(
            f"state['user_states']['samplers'] has {sorted(names)}, but this "
            f"loader's samplers with state_dict()/load_state_dict() are "
            f"{sorted(owners)}: pass the sampler and batch_sampler the state "
            "was saved with"
        )
    for name, obj in owners.items():
        obj.load_state_dict(saved[name])


def load_iterator(iterator: Any, saved: dict[str, Any]) -> None:
    if "iterator" not in saved:
        return
    if not is_stateful(iterator):
        raise ConfigError(
            "state['user_states']['samplers']['iterator'] is the state of a "
            f"sampler's iterator, but this loader's sampler iterator "
            f"({type(iterator).__name__}) has no load_state_dict(): pass the "
            "sampler the state was saved with"
        )
    iterator.load_state_dict(saved["iterator"])


def sampled_batches(
    loader: Any, saved: dict[str, Any] | None, skip: int
) -> tuple[Iterator[Any], SamplerStates | None]:
    """An epoch's index lists from `loader`'s sampler, from batch `skip` on:
    Stateful samplers load their `saved` states (and are asked theirs as
    batches are drawn); other samplers draw the batches delivered before
    the state was saved again."""
    owners = sampler_owners(loader)
    if saved is not None:
        load_samplers(owners, saved)
    indices = iter(loader._index_sampler)
    if saved is not None:
        load_iterator(indices, saved)
    batches = indices if loader._auto_collation else ([i] for i in indices)
    if saved is None:
        for _ in range(skip):  # delivered before the state was saved
            next(batches, None)
    if not owners and not is_stateful(indices):
        return batches, None
    samplers = SamplerStates(owners)
    samplers.begin(indices, skip, saved)
    return samplers.drawing(batches, skip), samplers

from collections.abc import Iterator
from typing import Any, SupportsIndex, TypeVar, overload

_R = TypeVar("_R", bound=RecordReader)

PICKLED: int
ENCODED: int
FIRST_KEY_SET: int
KEY_SETS: int

class Encoder:
    def plain(self, record: Any) -> bytes | None: ...
    def values(self, record: dict[Any, Any]) -> bytes | None: ...

class RecordReader:
    _data: Any
    _starts: Any
    _ends: Any
    _key_sets: tuple[tuple[str, ...], ...]
    def __init__(
        self, data: Any, starts: Any, ends: Any, key_sets: tuple[tuple[str, ...], ...]
    ) -> None: ...
    def __len__(self) -> int: ...
    @overload
    def __getitem__(self, index: SupportsIndex) -> Any: ...
    @overload
    def __getitem__(self: _R, index: slice) -> _R: ...
    def __iter__(self) -> Iterator[Any]: ...

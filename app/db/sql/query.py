"""``Query``: a statement with a name, as every module of this package defines its statements.

Statements are written with named parameters (``:queue``); ``Query`` rewrites them once, at import, to
asyncpg's positional ``$n`` and binds arguments by name, so a long statement never depends on argument
order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_PARAM = re.compile(r"(?<![:\w]):([a-z_][a-z0-9_]*)")


@dataclass(frozen=True)
class Query:
    name: str
    text: str  # the statement, as asyncpg receives it ($1, $2, ...)
    params: tuple[str, ...] = field(default=())

    @classmethod
    def define(cls, name: str, sql: str) -> Query:
        params: list[str] = []

        def number(match: re.Match[str]) -> str:
            if match[1] not in params:
                params.append(match[1])
            return f"${params.index(match[1]) + 1}"

        return cls(name, _PARAM.sub(number, sql), tuple(params))

    def args(self, **values: Any) -> list[Any]:
        missing = set(self.params) - values.keys()
        extra = values.keys() - set(self.params)
        if missing or extra:
            raise TypeError(f"{self.name}: missing {sorted(missing)}, unexpected {sorted(extra)}")
        return [values[p] for p in self.params]

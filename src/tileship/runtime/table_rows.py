"""The compiled table's bookkeeping on the dispatcher's side: which rows it holds, and when they go.

``OpRunner`` (``runtime.dispatch``) inherits this. The table (``runtime.native.NativeTable``) only ever
holds rows the Python dispatcher wrote for keys it has memoized: a kernel row (the kernel's tvm-ffi
entry function, launched in C) or a route row (an index into ``_native_routes``: the reference, or a
Python launcher, serves that key). Every change of a decision drops all rows (``_drop_rows``, under the
runner's lock), and the next call of each key writes its row again from the memo, so the table can
never serve a key differently from the Python path. Checked calls (``check_finite``) never go to it.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tileship.runtime.decision import Entry
    from tileship.runtime.route import Route

MEMO_LIMIT = 8192


class TableRows:
    """Mixin: the compiled table of an operator and the rows the dispatcher writes into it."""

    _lock: threading.RLock
    _memo: dict[tuple[Any, ...], Route]
    entries: list[Entry]
    _table: Any
    _native: Callable[..., Any] | None
    _native_routes: list[Route]
    _check_finite: bool

    @property
    def check_finite(self) -> bool:
        """Recompute non-finite kernel outputs on the reference (``OpRunner``'s class doc)."""
        return self._check_finite

    @check_finite.setter
    def check_finite(self, on: bool) -> None:  # the compiled table never serves checked calls
        self._check_finite = bool(on)
        self._native = None if on or self._table is None else self._table.call

    def forget(self) -> None:
        """Forget every memoized key (and the compiled table's rows): the next calls resolve again."""
        with self._lock:
            self._memo.clear()
            self._drop_rows()

    # -- the compiled table ----------------------------------------------------------
    def use_native(self, table: Any) -> None:
        """Serve memoized keys through ``table`` (``runtime.native.NativeTable``) from now on; its
        kernel calls count in each entry's ``native_calls``."""
        with self._lock:
            self._table = table
            self._drop_rows()
            for slot, entry in enumerate(self.entries):
                entry.native_calls = partial(table.count, slot)
                entry.on_kernel_change.append(_weak_drop(self))
        self.check_finite = self._check_finite

    def _drop_rows(self) -> None:
        """Under ``_lock``: the table forgets every row; routes will be written again when next served."""
        if self._table is not None:
            self._table.clear()
            for route in self._memo.values():
                route.native = None

    def _native_put(self, route: Route, args: tuple[Any, ...]) -> None:
        """Write ``route``'s row (the call ``args`` has its key): the kernel's entry function where
        the table can launch it, else a route row. Route rows' indices are never reused (the list only
        grows, up to ``4 * MEMO_LIMIT``), so an index read from the table names its key's route even
        across a drop of the rows."""
        with self._lock:
            table, entry = self._table, route.entry
            if table is None or route.native is not None:
                return
            slot = next((i for i, e in enumerate(self.entries) if e is entry), -1)
            fast = entry.kernel is not None and entry.kernel is route.kernel and slot >= 0
            if fast and route.ffi is not None:
                route.native = slot
                table.put_kernel(slot, route.ffi, route.anchor, args)
            elif fast and route.c_call is not None and table.put_c(slot, route.c_call, args):
                route.native = slot
            elif len(self._native_routes) < 4 * MEMO_LIMIT:
                route.native = len(self._native_routes)
                self._native_routes.append(route)
                table.put_reference(route.native, args)
            else:
                route.native = -1  # the Python path finds it, as without a table


def _weak_drop(runner: TableRows) -> Callable[[], None]:
    """A hook that drops ``runner``'s rows while the runner lives (entries may outlive a runner)."""
    ref = weakref.ref(runner)

    def drop() -> None:
        r = ref()
        if r is not None:
            with r._lock:
                r._drop_rows()

    return drop


__all__ = ["MEMO_LIMIT", "TableRows"]

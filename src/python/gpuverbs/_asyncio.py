"""How completions reach a running asyncio loop: no thread, no busy polling.

A :class:`gpuverbs.Context` gathers the completion channels of its CQs in one
epoll descriptor. The first ``await`` on a context's operation adds that
descriptor to the running loop (``loop.add_reader``); when the NIC completes
work the loop calls ``Context.poll()``, which runs the C++ completion
processing on the loop's thread and completes the awaiting futures there.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any, Dict, Generator

from . import _core

_drivers: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Dict[int, _Driver]]" = weakref.WeakKeyDictionary()


class _Driver:
    """Drives one Context from one loop."""

    __slots__ = ("_context", "_loop", "_scheduled", "__weakref__")

    def __init__(self, loop: asyncio.AbstractEventLoop, context: _core.Context) -> None:
        self._context = context
        self._loop = loop
        self._scheduled = False
        loop.add_reader(context.fileno(), self._run)

    def _run(self) -> None:
        self._scheduled = False
        self._context.poll()

    def kick(self) -> None:
        """Runs the context soon: what an initiation posted (a refusal, a
        queued start) is not announced by the descriptor."""
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._run)


_last: "tuple[Any, Any, Any]" = (None, None, None)  # (loop, context, driver) of the last await: no lookup


def driver(loop: asyncio.AbstractEventLoop, context: _core.Context) -> _Driver:
    global _last
    if _last[0] is loop and _last[1] is context:
        return _last[2]  # type: ignore[no-any-return]
    per_loop = _drivers.get(loop)
    if per_loop is None:
        per_loop = {}
        _drivers[loop] = per_loop
    d = per_loop.get(id(context))
    if d is None or d._context is not context:
        d = _Driver(loop, context)
        per_loop[id(context)] = d
    _last = (loop, context, d)
    return d


def await_operation(op: _core.Operation) -> Generator[Any, None, Any]:
    """Operation.__await__: a future on the running loop, completed by the
    C++ handler; cancelling the awaiting task cancels the operation by the C++
    rules (not yet posted: aborted; posted: it completes, its memory held)."""
    if op.done:
        return op.result()
    loop = asyncio.get_running_loop()
    context = op.context
    driver(loop, context)
    future = loop.create_future()
    op._set_future(future)
    # What the initiation posted (a refusal, a start that waited) runs now, on
    # this thread; completions come through the descriptor.
    context.poll()
    try:
        return (yield from future)
    except asyncio.CancelledError:
        op.cancel()
        context.poll()  # the aborted operation's handler is posted, not signalled
        raise

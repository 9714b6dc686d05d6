"""Awaiting work within a deadline: the one ``asyncio.timeout`` of the request path.

Kept out of the compiled modules of :data:`gateway.native.COMPILED` on purpose. Compiled with
mypyc, an await in a ``finally`` — and so an ``async with``, whose exit is one — brings back
a cancellation that was thrown into the coroutine and handled further down: a request past
its deadline would end as a cancellation instead of a 504. The compiled modules therefore
hold no ``async with`` and no await in a ``finally``; they await :func:`within` instead. See
docs/gateway.md#compiled-modules.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable


async def within(deadline_s: float, work: Awaitable[object]) -> bool:
    """Await ``work`` for at most ``deadline_s`` [s]: whether it ended in time (past it, the
    work is cancelled and False returned)."""
    try:
        async with asyncio.timeout(deadline_s):
            await work
    except TimeoutError:
        return False
    return True

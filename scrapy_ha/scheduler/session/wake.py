"""The background task's wait between two rounds."""

from __future__ import annotations

import asyncio
import contextlib


async def between_rounds(wake: asyncio.Event, tick: float) -> None:
    """Wait for *wake* (at once if it came during the round before) or *tick* seconds; then
    let the callbacks ready to run with the wake run first, before the round starts.

    What wakes the task is the engine at work: a callback's output queued, a request handed
    out from memory, a download finished. The engine goes on in callbacks made ready with
    that wake (its next look for a request, the rest of a callback's output), and run before
    the round, what they yield or hand out goes with it. Without that one turn of the event
    loop the round ran first, and a second round followed at once for what they did: on the
    static-site benchmark, 0.10 sync calls a page instead of 0.052, at loopback and with
    Redis 3 ms away alike (docs/benchmarks.md). One turn costs no time waiting: nothing is
    delayed past what the loop already had ready.
    """
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(tick):
            await wake.wait()
    await asyncio.sleep(0)

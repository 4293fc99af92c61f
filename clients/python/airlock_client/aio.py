"""The asyncio face of :class:`~airlock_client.client.Client`: the same calls, awaited. The
blocking work runs on the event loop's default executor; one client serves many tasks."""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Dict

from .client import Client, Decision, Settlement


class AsyncClient:
    """``async with AsyncClient(...) as airlock: await airlock.propose(...)``; the
    constructor takes :class:`Client`'s arguments."""

    def __init__(self, *args: Any, **kwargs: Any):
        self.sync = Client(*args, **kwargs)

    async def propose(self, timeout: float = 60.0, **call: Any) -> Decision:
        return await self._run(self.sync.propose, timeout=timeout, **call)

    async def wait_settled(self, operation_key: str, **kwargs: Any) -> Settlement:
        return await self._run(self.sync.wait_settled, operation_key, **kwargs)

    async def fence_run(self, run_id: str, fence: int, operator: str, **kwargs: Any) -> Dict[int, Decision]:
        return await self._run(self.sync.fence_run, run_id, fence, operator, **kwargs)

    def latest_reply(self, answer: Decision) -> Decision:
        """:meth:`Client.latest_reply` (no wait: it reads what the reader has read)."""
        return self.sync.latest_reply(answer)

    async def close(self) -> None:
        await self._run(self.sync.close)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    @staticmethod
    async def _run(fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(
            None, functools.partial(fn, *args, **kwargs)
        )

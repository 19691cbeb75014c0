"""Issue 3: SSE keep-alive comments (a short interval configured for the test)."""

from __future__ import annotations

import pytest

from app.config import Settings
from tests.acceptance.test_streams import Events
from tests.fixtures import quiet_settings


@pytest.fixture
def settings() -> Settings:
    return quiet_settings(keep_alive_s=0.2)


async def test_keep_alive_comments_arrive(live):
    async with live.client.stream("GET", "/v2/jobs/stream?type=idle&maxJobs=1&timeout=1000") as r:
        events = Events(r)
        with pytest.raises(TimeoutError):
            await events.next_job(wait_s=1.0)
        assert any(line.startswith(": keep-alive") for line in events.comments), events.comments

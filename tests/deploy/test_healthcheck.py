"""``python -m app.healthcheck``, the image's HEALTHCHECK: the URL it asks, from the same
JOBFAIR_* variables as the server, and its answer against a real server, over HTTP and
HTTPS (whose certificate it need not trust)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from app.config import Settings
from app.healthcheck import check, healthz_url
from tests.fixtures import Live, free_port


def test_it_asks_where_the_server_listens_by_default():
    defaults = Settings()
    assert healthz_url({}) == f"http://{defaults.host}:{defaults.port}/healthz"


def test_a_server_on_every_address_is_asked_over_loopback_and_https_with_a_certificate():
    assert healthz_url({"JOBFAIR_HOST": "0.0.0.0", "JOBFAIR_PORT": "9000"}) == (
        "http://127.0.0.1:9000/healthz"
    )
    assert healthz_url({"JOBFAIR_HOST": "::"}) == "http://[::1]:8080/healthz"
    assert healthz_url({"JOBFAIR_SSL_CERTFILE": "/run/tls/cert.pem"}) == (
        "https://127.0.0.1:8080/healthz"
    )


async def test_a_serving_server_is_healthy_over_http_and_https(live: Live, live_tls: str):
    # Blocking calls, and the server runs in this event loop: from a thread.
    assert await asyncio.to_thread(check, f"{live.url}/healthz") is None
    assert await asyncio.to_thread(check, f"{live_tls}/healthz") is None  # CA not trusted
    assert await asyncio.to_thread(check, f"{live.url}/nowhere") == (
        f"{live.url}/nowhere: HTTP 404"
    )


def test_the_command_exits_1_with_one_line_when_nothing_answers():
    port = free_port()
    ran = subprocess.run(
        [sys.executable, "-m", "app.healthcheck"],
        env={"JOBFAIR_PORT": str(port)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert ran.returncode == 1
    (line,) = ran.stderr.splitlines()
    assert line.startswith(f"unhealthy: http://127.0.0.1:{port}/healthz: ")

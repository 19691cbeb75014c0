"""``python -m app.healthcheck``: the container image's HEALTHCHECK.  Exits 0 when the
server on this machine answers ``GET /healthz`` with 200, else 1 with one line saying why.

The standard library only, reading the ``JOBFAIR_*`` variables the server reads (their
defaults are ``app.config.Settings``'): it runs every few seconds, and importing the app
would cost a second of CPU each time.
"""

from __future__ import annotations

import os
import ssl
import sys
import urllib.error
import urllib.request

TIMEOUT_S = 5.0
# A server listening on every address is asked over loopback.
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def healthz_url(env: dict[str, str]) -> str:
    host = env.get("JOBFAIR_HOST", "127.0.0.1")
    host = _WILDCARDS.get(host, host)
    if ":" in host:
        host = f"[{host}]"
    scheme = "https" if env.get("JOBFAIR_SSL_CERTFILE") else "http"
    return f"{scheme}://{host}:{env.get('JOBFAIR_PORT', '8080')}/healthz"


def check(url: str) -> str | None:
    """None when healthy, else what is wrong."""
    # Whether this process answers, not whom to trust: its certificate names the service,
    # not the loopback address asked here.
    context = ssl._create_unverified_context() if url.startswith("https:") else None
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S, context=context) as answer:
            status = answer.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (OSError, ValueError) as exc:
        return f"{url}: {exc}"
    return None if status == 200 else f"{url}: HTTP {status}"


def main() -> int:
    problem = check(healthz_url(dict(os.environ)))
    if problem is not None:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

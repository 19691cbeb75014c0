"""Opening a connection: each host of a multi-host URL in turn, each with its own time.

asyncpg tries the hosts of a URL one after the other, but under one time limit for them
all (``timeout``, 60 s by default): a host that accepts the TCP connection and never
answers -- the primary's machine lost without a word, or cut off by the network, with
the standby promoted behind it in the list -- spends the whole limit, and the hosts
after it are never tried.  Every connection Jobfair makes would then wait on the lost
primary forever.  libpq gives each host its own ``connect_timeout``; so does this, under
the same name in the URL (seconds, per host; default ``CONNECT_TIMEOUT_S``).  It is
taken out of the URL asyncpg sees, which would otherwise send it to the server as a
setting, and refused.

Which host to keep is still asyncpg's decision (``target_session_attrs``): a host that is
not of the kind asked for is passed over, as one that is down.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from typing import Any

import asyncpg

CONNECT_TIMEOUT_S = 10.0


def per_host(url: str) -> tuple[list[str], float]:
    """``url`` once for each host it names, in order, without ``connect_timeout``; and
    that timeout (seconds, per host).  A URL naming one host, or none, is given as it is
    (but for the timeout)."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    params = dict(query)
    timeout_s = CONNECT_TIMEOUT_S
    if "connect_timeout" in params:
        timeout_s = float(params.pop("connect_timeout"))
        if not timeout_s > 0:
            raise ValueError("connect_timeout must be a positive number of seconds")
        query = [(k, v) for k, v in query if k != "connect_timeout"]
        parts = parts._replace(query=_encode(query))
        url = urllib.parse.urlunsplit(parts)
    auth, at, hostspec = parts.netloc.rpartition("@")
    if "," in hostspec:  # postgresql://user@h1:5432,h2:5432/db
        netlocs = [f"{auth}{at}{host}" for host in hostspec.split(",")]
        return [urllib.parse.urlunsplit(parts._replace(netloc=n)) for n in netlocs], timeout_s
    if not hostspec and "," in params.get("host", ""):  # ?host=h1,h2&port=5432,5433
        hosts = params["host"].split(",")
        ports = params["port"].split(",") if "port" in params else []
        if len(ports) == 1:
            ports *= len(hosts)
        urls = []
        for i, host in enumerate(hosts):
            one = {**params, "host": host} | ({"port": ports[i]} if ports else {})
            urls.append(urllib.parse.urlunsplit(parts._replace(query=_encode(one.items()))))
        return urls, timeout_s
    return [url], timeout_s


def _encode(query: Any) -> str:
    return urllib.parse.urlencode(list(query), safe="/,:[]")


async def connect(url: str, **kwargs: Any) -> asyncpg.Connection:
    """``asyncpg.connect(url, **kwargs)``, trying each host of ``url`` in turn with a time
    limit of its own; the last host's error when none will do (as asyncpg does).  The
    signature of ``asyncpg.connect``, so that a pool can open its connections with it."""
    kwargs.pop("timeout", None)  # per host here, from the URL
    # Every connection names the server's version (docs/upgrading.md): a contracting
    # migration waits until no connection of an older one is left (app.migrations).
    from app.migrations import application_name

    settings = dict(kwargs.pop("server_settings", None) or {})
    if "application_name=" not in urllib.parse.urlsplit(url).query:  # the URL's wins
        settings.setdefault("application_name", application_name())
    kwargs["server_settings"] = settings
    urls, timeout_s = per_host(url)
    for i, one in enumerate(urls):
        try:
            return await asyncpg.connect(one, timeout=timeout_s, **kwargs)
        except asyncio.CancelledError:
            raise
        except Exception:
            if i == len(urls) - 1:
                raise
    raise AssertionError("per_host() gave no URL")

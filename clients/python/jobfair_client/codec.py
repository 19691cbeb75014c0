"""JSON in and out of the wire, by the standard library.

Bodies are encoded here rather than by httpx so that a worker can measure what it sends
(a batch of completions is kept under a size), compactly, and without NaN or infinities:
the server refuses those, so they are refused here, before anything is sent.

orjson was tried for parsing answers and not kept: parsing a 50-job activation costs the
standard library about 10 µs per job here, and building the ``Job`` objects 15 µs; the
worker's whole share is about 100 µs per job, and it waits on the server most of the
time.  A dependency for a few microseconds was not worth it.
"""

from __future__ import annotations

import json
from typing import Any

CONTENT_TYPE = {"Content-Type": "application/json"}

_encode = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode
loads = json.loads


def dumps(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON; ValueError for NaN or an infinity."""
    return _encode(value).encode()

"""The ASGI entry point for uvicorn worker processes (``app.asgi:app``).

``jobfair serve`` resolves the database (starting the embedded server if needed) and
passes its URL down in ``JOBFAIR_DATABASE_URL`` before uvicorn imports this module.
"""

from __future__ import annotations

import os

from app.config import Settings
from app.main import create_app

app = create_app(Settings(), os.environ["JOBFAIR_DATABASE_URL"])

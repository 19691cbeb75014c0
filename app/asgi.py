"""The ASGI entry point for uvicorn worker processes (``app.asgi:app``).

``jobfair serve`` resolves the database (starting the embedded server if needed) and
passes its URL down in ``JOBFAIR_DATABASE_URL`` before uvicorn imports this module.
"""

from __future__ import annotations

import gc
import os

from app.config import Settings
from app.main import create_app

# ``jobfair serve`` sets JOBFAIR_AUTH (off only on loopback).  Served any other way
# (uvicorn or gunicorn given this module), the bind address is not known here: keys are
# then required unless JOBFAIR_AUTH says otherwise.
settings = Settings() if os.environ.get("JOBFAIR_AUTH") else Settings(auth="required")
app = create_app(settings, os.environ["JOBFAIR_DATABASE_URL"])

# What is imported and built by now lives as long as the process: keep it out of the
# collector's generations, so that a full collection walks only what serving allocated
# rather than every object imported at start: a full collection pauses every request in
# this process, and this keeps the pause short.
gc.collect()
gc.freeze()

"""Storage: the only package that speaks SQL.

One module per concept -- ``lanes`` (the protocol that keeps a lane with ready jobs
readable, and the caps' holds), ``claims``, ``jobs``, ``finishing``, ``maintenance``,
``operators`` -- each a set of named statements with a header (what, index, locks) and
the functions that run them; ``pool`` (``Database``: the pool behind one error
boundary), ``locks`` (the advisory-lock keys), ``listen`` (the LISTEN connection),
``leader`` (the leader lock), ``rows`` (the typed rows every function answers),
``schema`` (the tables, for Alembic), ``catalog`` (the statements as SQL files for
review: ``docs/sql``).

Functions take where to run as their first argument: the ``Database`` (autocommit) or a
connection in a transaction a service opened with ``Database.transaction()``.
"""

from app.db.pool import Database
from app.errors import OutcomeUnknown, StoreUnavailable

__all__ = ["Database", "OutcomeUnknown", "StoreUnavailable"]

"""``jobfair demo``: fairness you can watch.

It starts a server on an embedded PostgreSQL of its own, has a *flood* tenant dump a
large backlog and a *trickle* tenant make a few jobs a second, both of one job type and
with weights, and runs workers (asyncio tasks here, over HTTP, as any worker) until the
flood has drained.  A live table shows each tenant's backlog, its share of the
activations against the share its weight entitles it to, and how long the trickle's
jobs wait; the end states the measured shares and the trickle's worst wait.

What fairness means here: the trickle asks for far less than its entitled share, so it
should get all it asks for, at once, while the flood takes the rest (a FIFO queue would
make each trickle job wait behind the whole flood).  The wait measured is the server's
own, ``activatedAt - createdAt`` of each activated job: ready (created, not delayed) to
activated.
"""

from app.demo.command import register

__all__ = ["register"]

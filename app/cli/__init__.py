"""The ``jobfair`` command: ``main`` (serve, migrate, keys, on the database), the
operators' commands over HTTP (``commands`` and the modules it gathers), and the client
they share (``client``)."""

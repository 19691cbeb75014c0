"""Infrastructure under the server: the process supervisor (``supervisor``: ``--workers N``,
the listening socket, restarts) and the bounded HTTP protocol (``http``)."""

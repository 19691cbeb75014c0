"""Prometheus metrics: the events the hot path counts (``events``, a leaf that imports
nothing of the app), what a scrape reads (``scrape``) and the background work behind
them (``loops``).  docs/metrics.md has every series."""

"""A record module that fails while it is imported."""

raise RuntimeError("the settings module is missing")

"""Unified Rocket Rides: the demo application built on unilog, and the template for your own fleet.

``api`` stages a log record with every ride it creates; ``simulator`` drives the API; ``consumer`` is the
reference design's distance consumer; ``migrate`` prepares the database (unilog's tables and the app's).
"""

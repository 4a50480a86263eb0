"""jobq: an HTTP job queue on PostgreSQL."""

__version__ = "0.1.0"

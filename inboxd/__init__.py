"""inboxd: a self-hosted inbox management service."""

__version__ = "0.1.0"

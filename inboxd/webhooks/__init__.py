"""Outgoing webhooks: URL rules, signing, the HTTP client, and the inbox webhook's deliverer."""

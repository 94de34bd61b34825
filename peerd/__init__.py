"""peerd daemon and CLI."""

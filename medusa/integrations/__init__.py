"""Integrations with other engines."""

"""Serving: the worker's OpenAI-compatible API (and, later, the gateway)."""

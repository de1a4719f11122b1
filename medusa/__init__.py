"""Medusa: fast cold starts for LLM inference servers."""

__version__ = "0.1.0"

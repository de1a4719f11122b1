"""The `medusa` subcommands, one module per idea (medusa/cli.py assembles them)."""

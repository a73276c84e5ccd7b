"""`casmoe` subcommands: backend (placeholder until its issue lands)."""

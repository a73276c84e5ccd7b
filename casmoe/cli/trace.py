"""`casmoe` subcommands: trace (placeholder until its issue lands)."""

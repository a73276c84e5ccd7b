"""`casmoe` subcommands: simulate (placeholder until its issue lands)."""

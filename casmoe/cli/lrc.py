"""`casmoe` subcommands: lrc (placeholder until its issue lands)."""

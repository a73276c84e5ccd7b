"""`casmoe` subcommands: planner (placeholder until its issue lands)."""

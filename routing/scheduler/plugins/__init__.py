"""Scheduler plugins, one per module: filters, scorers and pickers (see the framework)."""

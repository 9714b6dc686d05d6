"""overhead."""

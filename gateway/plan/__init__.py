"""``ridge plan``: from recorded traffic to the fleet that serves it best (docs/planning.md)."""

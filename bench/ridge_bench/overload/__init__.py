"""overload."""

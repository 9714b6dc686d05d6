"""kv_events."""

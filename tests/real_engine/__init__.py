"""The real-engine tier: ridge in front of real vLLM (CPU build) servers."""

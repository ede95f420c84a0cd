"""Multi-turn environments and the OpenAI-compatible proxy that records agent calls."""

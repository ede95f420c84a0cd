"""Multi-turn environments (`task=env:NAME`) and the OpenAI-compatible proxy that records agent calls."""

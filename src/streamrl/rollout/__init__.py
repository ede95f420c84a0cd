"""Producing rollouts: generate and score groups (generate.py), multi-turn episodes (episodes.py),
agent episodes through the OpenAI-compatible proxy (agent.py), and the rollout worker (worker.py)."""

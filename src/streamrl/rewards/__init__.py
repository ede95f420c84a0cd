"""Rewards: answer extraction, verifiers (reasoning-gym, math-verify), shaping, an LLM judge (judge.py)
and a RewardService that scores in an isolated worker pool (service.py, workers.py)."""

"""Rewards: answer extraction, verifiers (reasoning-gym, math-verify) and shaping."""

"""Rollout engines behind one protocol (base.Engine)."""

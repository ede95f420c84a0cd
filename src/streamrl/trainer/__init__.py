"""Trainer: log-prob recompute, token-budget micro-batches, loss, optimizer step, checkpoints."""

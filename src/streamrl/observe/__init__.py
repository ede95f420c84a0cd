"""Metrics stream (JSONL + TensorBoard) and the console progress bar."""

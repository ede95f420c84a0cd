"""Problem sources, prompt building and the train/held-out split."""

"""Multi-turn environments (`task=env:NAME`): episodes of model turns and environment observations."""

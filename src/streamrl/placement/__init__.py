"""Where rollout workers run and how weights reach them: local processes (backend.py) with shared
memory (shared_weights.py), or Ray actors (ray_rollouts.py, ray_actor.py) with object-store or
broadcast weight sync (weight_sync.py)."""

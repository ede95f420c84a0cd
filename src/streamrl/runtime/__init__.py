"""Runtime: rollouts, the RL step loop, the train job."""

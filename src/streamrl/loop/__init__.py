"""The RL loop: one RL step (step.py), the colocated and asynchronous loops that feed it, the
staleness bound, the exactly-once ledger, the resumable run state and the train job."""

"""Follower stand-ins for tests/test_distributed.py (module level: spawned processes import them)."""

import time


def never_join(*args):
    """A rank that never joins the process group."""
    time.sleep(120)


def join_then_hang(rank, world, init_method, cfg_dict, commands, errors, parent_pid=0):
    """A rank that joins the process group, then never takes part in a collective."""
    from streamrl.config import from_dict
    from streamrl.trainer.distributed import init_group

    init_group(from_dict(cfg_dict), rank, world, init_method)
    time.sleep(120)

"""Follower stand-ins for tests/test_distributed.py (module level: spawned processes import them)."""

import time

# How long a stand-in stays stuck. Rank 0 gives up after train.dist_timeout_s and stops it long
# before; a rank 0 that ignored its timeout would still be waiting when the stand-in exits.
HANG_S = 240.0


def never_join(*args):
    """A rank that never joins the process group."""
    time.sleep(HANG_S)


def join_then_hang(rank, world, init_method, cfg_dict, commands, errors, parent_pid=0):
    """A rank that joins the process group, then never takes part in a collective."""
    from streamrl.config import from_dict
    from streamrl.trainer.distributed import init_group

    init_group(from_dict(cfg_dict), rank, world, init_method)
    time.sleep(HANG_S)


def terminated_while_starting(*args):
    """A rank that gets a SIGTERM before it runs run_follower (a job's group signal during its imports),
    then follows as a rank does."""
    import os
    import signal

    from streamrl.placement.trainer_ranks import run_follower

    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)
    run_follower(*args)


def exit_at_once(*args):
    """A rank whose process ends before it joins (a failed import or model load)."""
    raise SystemExit(3)

"""streamrl: fully asynchronous RL post-training of language models with verifiable rewards.

    import streamrl
    run = streamrl.train(model="tiny-random", reward_fn=my_reward, train_data=rows, max_steps=10)
    streamrl.evaluate(run.checkpoint, task="rg:chain_sum")

`streamrl.train` and `streamrl.evaluate` run the same jobs as `streamrl train` and `streamrl eval`
(streamrl/api.py); every config key is a keyword (`streamrl config` lists them).
"""

__version__ = "0.1.0"

from streamrl.api import ConfigError, Run, evaluate, train  # noqa: E402

__all__ = ["ConfigError", "Run", "__version__", "evaluate", "train"]

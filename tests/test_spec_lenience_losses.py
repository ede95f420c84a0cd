"""Lenient speculative rollouts by policy loss: which losses correct the mixture the engine sampled from.

SPEC-RL's lenient rule records the log-probability of the mixture each token came from (pi_behav), a
policy the trainer never had. Without a rollout correction, only a loss that weights each token by
pi_prox / pi_behav (its recomputed proximal policy over pi_behav) corrects it; every other loss takes
pi_behav as its old policy (PPO's and GSPO's clip, CISPO's clipped weight, truncated IS's cap and M2PO's
mask then bound the bias as if it were staleness) or weights nothing (REINFORCE)."""

from __future__ import annotations

import pytest

from streamrl.algo import registry
from streamrl.algo.registry import LossSpec
from streamrl.config import ConfigError, load_config

LENIENT = ["rollout.spec_drafts=4", "rollout.spec_lenience=1.5"]

# loss.name -> whether lenient rollouts are accepted with loss.rollout_correction=none. A new loss is
# missing here until someone has read what its gradient is weighted by.
ACCEPTS_LENIENCE = {
    "decoupled_ppo": True,  # w = pi_prox / pi_behav, pi_prox recomputed by the trainer
    "ppo_clip": False,  # r = pi_theta / pi_behav, clipped around pi_behav
    "gspo": False,  # the sequence's mean log(pi_theta / pi_behav), clipped around 1
    "gspo_token": False,
    "cispo": False,  # sg(clip(pi_theta / pi_behav)): the bias is clamped into the band
    "truncated_is": False,  # sg(min(pi_theta / pi_behav, 1 + eps_high))
    "m2po": False,  # pi_theta / pi_behav, the tokens of largest (log r)^2 masked
    "reinforce": False,  # no weight at all
}


def refusal(why: str, fix: str) -> str:
    return (
        "rollout.spec_lenience > 0 biases the responses, which decoupled PPO's weight pi_prox / pi_behav "
        f"corrects, but {why}: set {fix}, a loss.rollout_correction, or rollout.spec_lenience=0"
    )


def test_every_registered_loss_has_its_lenience_decided():
    assert set(registry.POLICY_LOSSES) == set(ACCEPTS_LENIENCE)


@pytest.mark.parametrize("name", sorted(registry.POLICY_LOSSES))
def test_lenience_by_loss(name):
    overrides = [*LENIENT, f"loss.name={name}"]
    if ACCEPTS_LENIENCE[name]:
        load_config(None, overrides)
        return
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert str(e.value) == refusal(f"loss.name={name} has no such weight", "loss.name=decoupled_ppo")
    # a rollout correction weights by pi_old / pi_behav, the loss's ratio then being against pi_old
    load_config(None, [*overrides, "loss.rollout_correction=token_tis"])


@pytest.mark.parametrize("name", sorted(n for n, ok in ACCEPTS_LENIENCE.items() if ok))
def test_a_proximal_policy_that_is_the_behaviour_policy_corrects_nothing(name):
    with pytest.raises(ConfigError) as e:
        load_config(None, [*LENIENT, f"loss.name={name}", "loss.prox=behav"])
    assert str(e.value) == refusal("loss.prox=behav makes that weight 1", "loss.prox=recompute")


def test_a_loss_registered_without_a_behaviour_weight_is_refused(monkeypatch):
    """What decides is the loss's registration, not its name."""
    monkeypatch.setitem(registry.POLICY_LOSSES, "plain_pg", LossSpec("plain_pg", lambda t, p: None))
    with pytest.raises(ConfigError) as e:
        load_config(None, [*LENIENT, "loss.name=plain_pg"])
    assert str(e.value) == refusal("loss.name=plain_pg has no such weight", "loss.name=decoupled_ppo")
    load_config(None, ["loss.name=plain_pg"])  # exact rollouts: nothing to correct


def test_a_behaviour_weight_needs_the_proximal_pass():
    with pytest.raises(
        ValueError, match="'plain_pg' weights by pi_prox / pi_behav: register it with proximal=True"
    ):
        registry.policy_loss("plain_pg", reads=(), behaviour_weight=True)
    assert "plain_pg" not in registry.POLICY_LOSSES

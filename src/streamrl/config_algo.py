"""Checks of the algorithm keys (loss.*, advantage.*): values in range across keys, and no key set that
the chosen loss, rollout correction or advantage estimator does not read (refused in one line rather
than ignored)."""

from __future__ import annotations

from typing import Any

from streamrl.config_parse import ConfigError

# keys a loss, a rollout correction or an advantage estimator may read (LossSpec/CorrectionSpec/AdvantageSpec
# .reads): a non-default value that none of the chosen pieces reads is refused rather than ignored
LOSS_KEYS = ("eps_low", "eps_high", "dual_clip", "behav_weight_cap", "m2_threshold", "prox")
CORRECTION_KEYS = ("rc_upper", "rc_lower", "rc_geo_tol", "rc_opsm_delta")
ADVANTAGE_KEYS = ("std_normalize", "gamma", "lam")
VALUE_KEYS = ("vf_coef", "value_clip")  # the value loss of a critic (advantage.name=gae)
KL_KEYS = ("kl_estimator", "kl_in")  # the KL term's form (loss.kl_coef > 0)


def _unread(
    section: str, obj: Any, keys: tuple[str, ...], reads: frozenset[str], who: str, choose: str
) -> None:
    default = type(obj)()
    for key in keys:
        value = getattr(obj, key)
        if value != getattr(default, key) and key not in reads:
            read = ", ".join(f"{section}.{k}" for k in sorted(reads)) or "none of them"
            raise ConfigError(
                f"config key '{section}.{key}'={value} is not read by {who} (it reads {read}): "
                f"remove it, or choose a {choose} that reads it"
            )


def unread_keys(cfg: Any, registry: Any) -> list[tuple[str, str]]:
    """(section, key) of the algorithm keys set off their default that the chosen loss, rollout
    correction or advantage estimator does not read."""
    lc, adv = cfg.loss, cfg.advantage
    loss, rc = registry.POLICY_LOSSES[lc.name], registry.CORRECTIONS[lc.rollout_correction]
    groups = [
        ("loss", lc, LOSS_KEYS, loss.reads if rc.name == "none" else loss.reads - {"prox"}),
        ("loss", lc, CORRECTION_KEYS, rc.reads),
        ("advantage", adv, ADVANTAGE_KEYS, registry.ADVANTAGES[adv.name].reads),
    ]
    return [
        (section, key)
        for section, obj, keys, reads in groups
        for key in keys
        if key not in reads and getattr(obj, key) != getattr(type(obj)(), key)
    ]


def validate_algo(cfg: Any, registry: Any) -> None:
    """Loss, correction and advantage keys: values in range, and none set that the chosen pieces ignore."""
    lc, adv = cfg.loss, cfg.advantage
    loss, rc = registry.POLICY_LOSSES[lc.name], registry.CORRECTIONS[lc.rollout_correction]
    who = f"loss.name={lc.name}" + (f" with loss.rollout_correction={rc.name}" if rc.name != "none" else "")
    reads = loss.reads if rc.name == "none" else loss.reads - {"prox"}
    if lc.behav_weight_cap and "behav_weight_cap" in reads and (rc.name != "none" or lc.prox == "behav"):
        why = who if rc.name != "none" else "loss.prox=behav"  # pi_prox is the ratio's own old policy
        raise ConfigError(
            f"config key 'loss.behav_weight_cap'={lc.behav_weight_cap} caps pi_prox / pi_behav, which is 1 "
            f"with {why}: remove it, or use loss.prox=recompute without a rollout correction"
        )
    _unread("loss", lc, LOSS_KEYS, reads, who, "loss.name")
    rc_who = f"loss.rollout_correction={rc.name}"
    _unread("loss", lc, CORRECTION_KEYS, rc.reads, rc_who, "loss.rollout_correction")
    adv_who = f"advantage.name={adv.name}"
    _unread("advantage", adv, ADVANTAGE_KEYS, registry.ADVANTAGES[adv.name].reads, adv_who, "advantage.name")
    if lc.entropy_top_q < 1 and lc.name == "gspo":  # one ratio per sequence: every token shares its gradient
        raise ConfigError(
            "config key 'loss.entropy_top_q' selects tokens, but loss.name=gspo trains on each sequence's "
            "ratio, whose gradient reaches all its tokens: use loss.name=gspo_token, or loss.entropy_top_q=1"
        )
    if lc.behav_weight_cap and lc.behav_weight_cap < 1:
        raise ConfigError(
            f"config key 'loss.behav_weight_cap' must be 0 (off) or >= 1, got {lc.behav_weight_cap}"
        )
    if not 0 <= lc.rc_lower < lc.rc_upper:
        raise ConfigError(
            f"config keys 'loss.rc_lower' and 'loss.rc_upper' must satisfy 0 <= rc_lower < rc_upper, got "
            f"{lc.rc_lower} and {lc.rc_upper}"
        )
    if lc.kl_in == "token_reward" and not (registry.ADVANTAGES[adv.name].token_level and lc.kl_coef > 0):
        raise ConfigError(
            "loss.kl_in=token_reward shapes per-token rewards: it needs loss.kl_coef > 0 and a token-level "
            f"advantage (advantage.name=gae or reinforce_pp_token), got {adv.name} with kl_coef={lc.kl_coef}"
        )
    spec = registry.ADVANTAGES[adv.name]
    no_critic = f"advantage.name={adv.name} has no value head (advantage.name=gae)"
    _unset(lc, VALUE_KEYS, not spec.critic, no_critic)
    _unset(lc, KL_KEYS, lc.kl_coef == 0, "loss.kl_coef=0 has no KL term (set loss.kl_coef > 0)")


def _unset(obj: Any, keys: tuple[str, ...], unread: bool, why: str) -> None:
    """Refuse a non-default loss.KEY when `unread` (nothing reads it), saying `why`."""
    default = type(obj)()
    for key in keys if unread else ():
        if getattr(obj, key) != getattr(default, key):
            raise ConfigError(f"config key 'loss.{key}'={getattr(obj, key)} is not read: {why}; remove it")

"""Algorithm zoo: advantage estimators, policy losses, aggregations, KL estimators (pure functions)."""

from streamrl.algo import advantages, aggregation, kl, losses, losses_is  # noqa: F401  (registers by import)

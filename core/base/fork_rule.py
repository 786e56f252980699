"""The fork rule: which tokens are "forks" (docs/algorithms.md §2), written `abs:τ` (H ≥ τ nats, an
absolute threshold; τ = 0.672 is Qwen3-8B's 80th percentile, Wang et al.) or `top:q` (the step's top
q of tokens by H: the paper's own per-step rule, TRL's top_entropy_quantile, the `fork` strategy's).
One setting the producers compute the stored `fork` flag and `fork/frac` with and record in the
run's config, the detector and the pages read. Torch-free: the collector and the pages parse it too.

The default is `top:0.1`, chosen by evidence (issue 50, item 3; docs/probes.md): over 565 pivotal tokens
(value probes of every position, 3 seeds x both lrs, training and held-out completions) the step's top 10%
by H has the best F1 of the rules as defined, 0.206 [0.186, 0.225] against abs:0.672's 0.149 [0.126,
0.172] and top:0.2's 0.135 [0.122, 0.147]; its lift over random holds from the start of training to the
end (5.8, 5.8, 5.3) where abs:0.672's falls (6.8, 4.6, 2.6) as the model's entropy scale moves. A run
whose config records no rule was stored under the default of its time, abs:0.672: `recorded` says so."""
from __future__ import annotations

import math
from dataclasses import dataclass

from forksight.base.constants import FORK_ENTROPY


@dataclass(frozen=True)
class ForkRule:
    kind: str        # "abs" or "top"
    value: float     # τ in nats, or the share q

    @classmethod
    def parse(cls, text: "str | ForkRule | None") -> "ForkRule":
        """`abs:τ` (τ ≥ 0) or `top:q` (0 < q < 1); None: the default. ValueError says what is wrong."""
        if text is None:
            return DEFAULT_FORK_RULE
        if isinstance(text, ForkRule):
            return text
        kind, sep, number = str(text).strip().partition(":")
        try:
            value = float(number) if sep else math.nan
        except ValueError:
            value = math.nan
        if kind == "abs" and math.isfinite(value) and value >= 0:
            return cls("abs", value)
        if kind == "top" and 0 < value < 1:
            return cls("top", value)
        raise ValueError(f"fork rule {text!r}: write abs:τ (forks are tokens with H ≥ τ nats, τ ≥ 0, e.g. "
                         "abs:0.672) or top:q (the step's top q of tokens by H, 0 < q < 1, e.g. top:0.2)")

    def __str__(self) -> str:
        return f"{self.kind}:{self.value:g}"

    @property
    def relative(self) -> bool:
        return self.kind == "top"

    def threshold(self, entropy) -> float:
        """The fork threshold (nats) of a step's valid tokens' entropies (a numpy array): τ, or their
        (1−q) quantile, linear interpolation — numpy's default, as hooks.metrics.token_select's
        fork_threshold computes it on tensors (inf when there is none)."""
        import numpy as np

        if self.kind == "abs":
            return self.value
        values = np.asarray(entropy, dtype=np.float64)
        values = values[np.isfinite(values)]
        return float(np.quantile(values, 1.0 - self.value)) if values.size else math.inf

    def describe(self, threshold: float | None = None) -> str:
        """The rule in words, with a step's threshold in nats when known."""
        if self.kind == "abs":
            return f"fork: H ≥ {self.value:g} nats ({self})"
        at = f"; this step H ≥ {threshold:.3g} nats" if threshold is not None and math.isfinite(threshold) else ""
        return f"fork: the step's top {100 * self.value:g}% of tokens by H ({self}{at})"


DEFAULT_FORK_RULE = ForkRule("top", 0.1)
# the rule of runs stored before every producer recorded one in the run's config (the default then)
UNRECORDED_FORK_RULE = ForkRule("abs", FORK_ENTROPY)


def recorded(text: str | None) -> ForkRule:
    """The rule a stored run's flags were computed under, from the `fork_rule` its config records (None:
    not recorded; unreadable likewise): that rule, else UNRECORDED_FORK_RULE."""
    if text is None:
        return UNRECORDED_FORK_RULE
    try:
        return ForkRule.parse(text)
    except ValueError:
        return UNRECORDED_FORK_RULE

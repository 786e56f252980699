"""The fork rule: which tokens are "forks" (docs/algorithms.md §2), written `abs:τ` (H ≥ τ nats, an
absolute threshold; τ = 0.672 is Qwen3-8B's 80th percentile, Wang et al.) or `top:q` (the step's top
q of tokens by H: the paper's own per-step rule, TRL's top_entropy_quantile, the `fork` strategy's).
One setting the producers compute the stored `fork` flag and `fork/frac` with and record in the
run's config, the detector and the pages read. Torch-free: the collector and the pages parse it too.

The default stays `abs:0.672` until the probe study (issue 50, item 3) says which rule finds the
pivotal tokens on a given model: the value probes found its recall low on the readable preset
(docs/probes.md), on evidence too thin to choose another."""
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


DEFAULT_FORK_RULE = ForkRule("abs", FORK_ENTROPY)

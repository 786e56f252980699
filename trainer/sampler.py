"""The rollout engine: a copy of the policy in `sampler_dtype` that samples the rollouts, as vLLM
or SGLang would beside an FSDP trainer. It is refreshed from the policy's weights before each
rollout (so it always holds the last optimiser step's weights) and reports its own log p of every
token it sampled. `sampler_noise` (a test/bench tool) adds Gaussian noise to its logits from a
given step: a mismatch whose start is known.
"""
from __future__ import annotations

import copy

import torch

from forksight.trainer.rollout import Rollout, generate


class Sampler:
    """Samples with `model`: the policy itself when nothing would differ (same dtype, no noise),
    else a frozen copy whose parameters are cast to `dtype` (buffers such as RoPE's inv_freq stay
    float32, as `from_pretrained(dtype=...)` leaves them)."""

    def __init__(self, policy, dtype: str = "float32", *, noise: float = 0.0, noise_from_step: int = 0,
                 seed: int = 0) -> None:
        self.policy = policy
        self.dtype = getattr(torch, dtype)
        self.noise, self.noise_from_step, self.seed = noise, noise_from_step, seed
        self._noise_on = False
        self._generator: torch.Generator | None = None
        policy_dtype = next(policy.parameters()).dtype
        if self.dtype == policy_dtype and noise == 0:
            self.model = policy
            return
        self.model = copy.deepcopy(policy).eval().requires_grad_(False)
        for param in self.model.parameters():  # tied weights are one Parameter: cast once
            param.data = param.data.to(self.dtype)
        if noise > 0:
            self.model.get_output_embeddings().register_forward_hook(self._add_noise)
        _probe(self.model, dtype)

    @property
    def separate(self) -> bool:
        """True when the sampler is a copy (another dtype, or noise), not the policy itself."""
        return self.model is not self.policy

    @torch.no_grad()
    def refresh(self) -> None:
        """Copy the policy's current weights into the sampler (cast to its dtype); cheap: one
        copy per parameter, no allocation."""
        if not self.separate:
            return
        for mine, theirs in zip(self.model.parameters(), self.policy.parameters()):
            mine.copy_(theirs)

    def generate(self, tokenizer, prompts: list[str], group_size: int, *, step: int, temperature: float,
                 max_new_tokens: int, group_offset: int = 0, capture_logp: bool = True) -> Rollout:
        """Refresh, then sample a rollout with the sampler's log p of each token (capture_logp)."""
        self.refresh()
        self._noise_on = self.noise > 0 and step >= self.noise_from_step
        if self._noise_on:  # its own stream: the sampling draws stay those of a noiseless run's
            device = next(self.model.parameters()).device
            self._generator = torch.Generator(device=device).manual_seed(self.seed * 7_919 + step)
        try:
            return generate(self.model, tokenizer, prompts, group_size, temperature=temperature,
                            max_new_tokens=max_new_tokens, group_offset=group_offset,
                            capture_logp=capture_logp)
        finally:
            self._noise_on = False

    def _add_noise(self, module, inputs, logits: torch.Tensor) -> torch.Tensor | None:
        if not self._noise_on:
            return None
        noise = torch.randn(logits.shape, generator=self._generator, device=logits.device,
                            dtype=torch.float32)
        return (logits.float() + self.noise * noise).to(logits.dtype)


class SamplerUnsupported(ValueError):
    """The sampler's dtype does not run on this device / torch build."""


def _probe(model, dtype: str) -> None:
    """One short forward in the sampler's dtype: a device/torch build that lacks an op for it
    fails here with a message, not in the middle of the first rollout."""
    device = next(model.parameters()).device
    ids = torch.ones(1, 2, dtype=torch.long, device=device)
    try:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=torch.ones_like(ids))
    except (RuntimeError, NotImplementedError) as exc:
        raise SamplerUnsupported(f"sampler_dtype {dtype} does not run on {device} with this torch build "
                         f"({str(exc).splitlines()[0]}): choose sampler_dtype float32 or bfloat16, "
                         "or a device that supports it") from None

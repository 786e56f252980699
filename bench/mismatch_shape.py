"""Training–inference mismatch at a real model's shape: a bfloat16 copy of a Qwen2 policy samples
(as an inference engine would), the float32 policy trains on what it sampled; forksight's capture of
the sampler's log p (clean, log ratio, `mismatch/*` scalars, histogram: what StepReporter adds per
step) is timed against that training step's forward + backward, side by side in one run.

Shapes: on CUDA, Qwen2.5-0.5B's (24 layers, hidden 896, vocabulary 151,936); on the CPU a small
one so the run stays in minutes. Weights are random: the mismatch it reports is bf16 numerics on
near-uniform distributions, a floor, not what a trained model shows (`bench/mismatch.py` measures
that on the bundled trainer).

    python bench/mismatch_shape.py [--batch 16] [--length 512] [--repeats 5] [--out result.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from forksight.base.constants import MISMATCH_EDGES  # noqa: E402
from forksight.hooks.metrics.mismatch import clean_sampler_logp, log_ratio, ratio_scalars  # noqa: E402
from forksight.hooks.metrics.summary import histogram  # noqa: E402

SHAPES = {  # Qwen2.5-0.5B on CUDA; a small body with a realistic head's width on the CPU
    "cuda": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936),
    "cpu": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=32768),
}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _timed(fn, device: str) -> tuple[float, object]:
    _sync(device)
    start = time.perf_counter()
    out = fn()
    _sync(device)
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=None, help="sequences per step (default: 16 CUDA, 4 CPU)")
    parser.add_argument("--length", type=int, default=None, help="sampled tokens per sequence (512 CUDA, 64 CPU)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None, help="also write the JSON here")
    args = parser.parse_args()
    from transformers import Qwen2Config, Qwen2ForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    batch = args.batch or (16 if device == "cuda" else 4)
    length = args.length or (512 if device == "cuda" else 64)
    torch.manual_seed(0)
    config = Qwen2Config(**SHAPES[device], tie_word_embeddings=True, max_position_embeddings=4096)
    policy = Qwen2ForCausalLM(config).to(device)
    sampler = Qwen2ForCausalLM(config).to(device=device, dtype=torch.bfloat16)
    sampler.load_state_dict({k: v.to(torch.bfloat16) for k, v in policy.state_dict().items()})
    prompt = torch.randint(0, config.vocab_size, (batch, 16), device=device)
    with torch.no_grad():
        out = sampler.generate(prompt, do_sample=True, top_k=0, top_p=1.0, max_new_tokens=length,
                               min_new_tokens=length, output_logits=True, return_dict_in_generate=True,
                               pad_token_id=0)
    completion = out.sequences[:, prompt.shape[1]:]
    sampler_logits = torch.stack(out.logits, 1).float()
    sampler_logp = torch.log_softmax(sampler_logits, -1).gather(-1, completion[..., None])[..., 0]
    del sampler_logits, out
    mask = torch.ones_like(completion, dtype=torch.bool)
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.0)   # the step's work, weights unchanged

    def train_step():
        optimizer.zero_grad(set_to_none=True)
        logits = policy(torch.cat([prompt, completion], 1)).logits[:, prompt.shape[1] - 1:-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, completion[..., None])[..., 0]
        (-logp.mean()).backward()
        optimizer.step()
        return logp.detach()

    def capture(logp):
        clean, _ = clean_sampler_logp(sampler_logp, mask, "bench")
        ratios = log_ratio(logp, clean, mask)
        scalars = ratio_scalars(ratios, fork=torch.rand(mask.shape, generator=torch.Generator().manual_seed(1)) < 0.2)
        histogram(ratios[~torch.isnan(ratios)].numpy(), MISMATCH_EDGES)
        return scalars

    step_times, capture_times, scalars = [], [], {}
    for i in range(args.repeats + 1):   # the first round warms up and is dropped
        t_step, logp = _timed(train_step, device)
        t_cap, scalars = _timed(lambda: capture(logp), device)
        if i:
            step_times.append(t_step)
            capture_times.append(t_cap)
    result = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "shape": {**SHAPES[device], "batch": batch, "length": length,
                  "parameters": sum(p.numel() for p in policy.parameters())},
        "tokens_per_step": batch * length,
        "step_s_median": statistics.median(step_times),
        "capture_s_median": statistics.median(capture_times),
        "capture_over_step": statistics.median(capture_times) / statistics.median(step_times),
        "bf16_sampler_vs_fp32_trainer": {k: scalars[k] for k in (
            "mismatch/kl_k1", "mismatch/kl_k3", "mismatch/logp_diff_abs_mean", "mismatch/logp_diff_abs_max",
            "mismatch/is_ratio_p99", "mismatch/frac_outside_2x", "mismatch/seq_ess")},
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()

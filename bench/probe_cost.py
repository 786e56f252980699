"""What value probes cost at a real model's shape (issue 50, item 5): Qwen2.5-0.5B's architecture
(random init: the cost does not depend on the weights; vocabulary 151,936, 24 layers, hidden 896),
K = 16 continuations per value, completions of 256 and 1,024 tokens, on this machine's CPU.

Measured, side by side in one run: the decode time of one token for K rows at a context of the
completion's length (`generate`, KV cache, batch K), and the prefill of K rows. A value of a prefix of
t tokens costs a prefill of prompt + t tokens and about (T − t) decoded tokens (a continuation runs to
the length cap when nothing ends it: the upper bound). From them, per probed completion:
  - `all`: every prefix, T + 1 values;
  - `search`: about 2 + 2·p·⌈log2 T⌉ values for p pivotal tokens (an upper bound: one path to each
    pivot, two values per level; docs/probe_search.json measured 9.3 values per 44-token completion with
    1.5 pivots, under this bound's 20), for p = 1, 2, 4;
and what the default budget (probing at most 10% of training time) buys at typical step times.

    python bench/probe_cost.py --out docs/probe_cost.json --markdown docs/probe_cost.md   # ~15 min on 2 cores
    python bench/probe_cost.py --render docs/probe_cost.json --markdown docs/probe_cost.md
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path

from page_io import add_page_options, rendered_only, write_outputs

REPO = Path(__file__).resolve().parents[1]
PROMPT = 128                   # prompt tokens before the completion


def _model():
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=151_936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096,
                         tie_word_embeddings=True, torch_dtype="float32")
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).eval()


def _time(fn, repeats: int = 2) -> float:
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure(model, k: int, context: int, new: int) -> dict:
    """Seconds of a prefill of k rows of `context` tokens (generate of 1 token), and per decoded token
    at that context: (generate of 1 + new tokens − generate of 1) / new, so the prefill cancels."""
    import torch

    ids = torch.randint(0, 151_936, (k, context))
    attn = torch.ones_like(ids)

    def generate(n: int):
        def run():
            with torch.no_grad():
                model.generate(input_ids=ids, attention_mask=attn, do_sample=True, top_k=0, max_new_tokens=n,
                               min_new_tokens=n, pad_token_id=0)
        return run

    one = _time(generate(1))
    more = _time(generate(1 + new))
    return {"context": context, "prefill_s": round(one, 3), "decode_s_per_token": round(max(more - one, 0.0) / new, 4)}


def per_completion(T: int, k_cost: dict, values: float) -> float:
    """Seconds for `values` prefix values of a T-token completion: each a prefill of the prompt and
    about half the completion, and a continuation of about T/2 decoded tokens (spread prefixes)."""
    return values * (k_cost["prefill_s"] + (T / 2) * k_cost["decode_s_per_token"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--lengths", default="256,1024")
    parser.add_argument("--decode-tokens", type=int, default=8, help="tokens decoded per timing")
    add_page_options(parser, "docs/probe_cost.md")
    parser.add_argument("--note", default="", help="a line on the machine's state, written into the JSON")
    args = parser.parse_args()
    if rendered_only(args, markdown):
        return
    import torch

    torch.set_num_threads(max(1, torch.get_num_threads()))
    model = _model()
    rows, table = [], []
    for T in (int(x) for x in args.lengths.split(",")):
        cost = measure(model, args.k, PROMPT + T // 2, args.decode_tokens)      # a mid-completion prefix
        every = T + 1
        row = {"T": T, **cost, "values_all": every, "seconds_all": round(per_completion(T, cost, every), 1)}
        for p in (1, 2, 4):
            values = min(every, 2 + 2 * p * math.ceil(math.log2(T)))
            row[f"values_search_p{p}"] = values
            row[f"seconds_search_p{p}"] = round(per_completion(T, cost, values), 1)
        row["ratio_search_p2_over_all"] = round(row["values_search_p2"] / every, 4)
        rows.append(row)
        for step_s in (30, 120, 600):       # the budget: probing at most 10% of training time
            table.append({"T": T, "step_seconds": step_s,
                          "steps_per_probed_completion_all": math.ceil(row["seconds_all"] / (0.1 * step_s)),
                          "steps_per_probed_completion_search_p2":
                              math.ceil(row["seconds_search_p2"] / (0.1 * step_s))})
        print(json.dumps(row), flush=True)
    out = {"meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "device": "cpu",
                    "threads": torch.get_num_threads(), "python": platform.python_version(),
                    "torch": torch.__version__, "model": "Qwen2.5-0.5B shape, random init, float32",
                    "k": args.k, "prompt_tokens": PROMPT, "note": args.note},
           "per_completion": rows, "budget_10pct": table}
    write_outputs(out, args, markdown)


def _h(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min" if seconds >= 60 \
        else f"{seconds:.0f} s"


def markdown(out: dict) -> str:
    """The docs page (docs/probe_cost.md) from the JSON."""
    m = out["meta"]
    rows = "\n".join(
        f"| {r['T']} | {r['prefill_s']:.1f} s | {r['decode_s_per_token']:.3f} s | {r['values_all']} · {_h(r['seconds_all'])} | "
        f"{r['values_search_p1']} · {_h(r['seconds_search_p1'])} | {r['values_search_p2']} · {_h(r['seconds_search_p2'])} | "
        f"{r['values_search_p4']} · {_h(r['seconds_search_p4'])} |" for r in out["per_completion"])
    budget = "\n".join(f"| {b['T']} | {b['step_seconds']} s | every {b['steps_per_probed_completion_all']} steps | "
                        f"every {b['steps_per_probed_completion_search_p2']} steps |" for b in out["budget_10pct"])
    return f"""<!-- generated by bench/probe_cost.py from docs/probe_cost.json; do not edit -->
# What value probes cost at a real model's shape

{m['model']} (vocabulary 151,936, 24 layers, hidden 896), K = {m['k']} continuations per value, a
{m['prompt_tokens']}-token prompt, on this machine's CPU ({m['threads']} threads, torch {m['torch']}, {m['date']}).
{m['note']}

Measured: a prefill of K rows at a mid-completion context, and the decode time of one token for K
rows there (KV cache). A value costs a prefill and about T/2 decoded tokens (continuations of spread
prefixes, run to the length cap: an upper bound). `all` estimates T + 1 values; `search` about
2 + 2·p·⌈log2 T⌉ for p pivotal tokens per completion ([measured at 44 tokens](probe_search.md): 9.3
values per completion with 1.5 pivots, under this bound's 20).

| T | prefill (K rows) | decode / token (K rows) | `all`: values · time | `search` p = 1 | p = 2 | p = 4 |
|---|---|---|---|---|---|---|
{rows}

**What the default budget buys** (probing at most 10% of training time): one probed completion
every N steps, at typical step times (search with p = 2):

| T | step time | `all` | `search` |
|---|---|---|---|
{budget}

On a CPU, probing a real model's completions is a job for a spare machine (`forksight probe` offline,
on a stored run) rather than the training loop; `search` cuts it by the factor above. No GPU was
lent to this measurement, so no GPU figure is given; the same script measures one.
"""


if __name__ == "__main__":
    main()

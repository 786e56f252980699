"""The v1 trainer's hand-over through a real TransferQueue (Ray + ZMQ on CPU), for tests/test_verl.py.

Puts one step's rows into TransferQueue the way verl 0.9.1's v1 trainer leaves them before
`kv_clear` (the agent loop's fields with the engine's `rollout_log_probs`, the driver's
response-level `entropy` / `old_log_probs` / `advantages`, the workers' full-sequence
`sum_pi_squared` / `forksight_*`, a padding row, and a `response_mask` in which a rejection sampling
zeroed tokens: the masks from before it are what the old-log-prob hook read), reads them with
forksight's `read_step`, reports them through the `forksight` Tracking backend (a token-level TIS
and a rejection sampling on in verl's config) into a DuckDB file, and saves what it put for the
test to compare. Runs in .venv/verl.

Usage: python tests/verl_tq.py OUT_DIR
"""
from __future__ import annotations

import sys
from pathlib import Path

import ray
import torch

import verl  # noqa: F401 - loads forksight.verl through the entry point


def rows(seed: int = 0):
    """Two uid groups of 3, ragged prompts and responses, verdicts in reward_extra_info."""
    g = torch.Generator().manual_seed(seed)
    out, keys, tags = [], [], []
    for k in range(7):
        uid, session = ("u0", "u1", "pad")[min(k // 3, 2)], k % 3
        p, r = 2 + k % 3, 3 + (k * 5) % 4
        acc = bool(k in (0, 3, 4))
        old_log_probs = -torch.rand(r, generator=g) * 4
        field = {"prompts": torch.randint(3, 60, (p,), generator=g),
                 "responses": torch.randint(3, 60, (r,), generator=g),
                 "response_mask": torch.ones(r, dtype=torch.int64),
                 "rm_scores": torch.cat([torch.zeros(r - 1), torch.tensor([float(acc)])]),
                 "uid": uid, "extra_fields": {"reward_extra_info": {"acc": acc}},
                 # the driver's writes (response-level) and the workers' (prompt + response)
                 "entropy": torch.rand(r, generator=g) * 3, "old_log_probs": old_log_probs,
                 "rollout_log_probs": (old_log_probs + 0.3 * torch.randn(r, generator=g)).clamp(max=-1e-3),
                 "advantages": torch.randn(r, generator=g),
                 "sum_pi_squared": torch.rand(p + r, generator=g) * 0.5 + 0.05,
                 "forksight_top1": torch.rand(p + r, generator=g), "forksight_js": torch.rand(p + r, generator=g)}
        out.append(field)
        keys.append(f"{uid}_{session}_0")
        tags.append({"is_padding": uid == "pad", "seq_len": p + r})
    return keys, out, tags


def rejected(fields) -> list:
    """The response masks after a rejection sampling zeroed every third token of a session's rows."""
    return [(torch.arange(len(f["responses"])) % 3 != k % 3).long() for k, f in enumerate(fields)]


def main(out: Path) -> None:
    import transfer_queue as tq
    from tensordict import TensorDict
    from transfer_queue import KVBatchMeta
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict
    from verl.utils.tracking import Tracking

    from forksight.hooks.integrations.verl_state import STATE
    from forksight.hooks.integrations.verl_v1 import masks_of, read_step
    from forksight.trainer.model import build_tiny

    model = build_tiny(out / "model")
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    tq.init({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}})
    try:
        keys, fields, tags = rows()
        tq.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(fields), tags=tags)
        meta = KVBatchMeta(partition_id="train", keys=keys, tags=tags)
        before = masks_of(tq, meta)                 # what the old-log-prob hook reads
        kept = rejected(fields)                     # what verl's _compute_advantage writes back
        tq.kv_batch_put(keys=keys, partition_id="train", fields=TensorDict(
            {"response_mask": torch.nested.as_nested_tensor(kept, layout=torch.jagged)}, batch_size=len(keys)))
        config = {"trainer": {"forksight": {"db": str(out / "forksight.duckdb"), "token_groups": 2}},
                  "actor_rollout_ref": {"model": {"path": str(model)}, "rollout": {"n": 3}},
                  "algorithm": {"rollout_correction": {"rollout_is": "token", "rollout_is_threshold": 1.2,
                                                       "rollout_rs": "token_k1", "rollout_rs_threshold": "0.5_2.0",
                                                       "bypass_mode": False}}}
        STATE.trainer = object()                    # as inside a trainer's fit()
        tracking = Tracking("proj", "v1-tq", default_backend=["forksight"], config=config)
        logger = tracking.logger["forksight"]
        step = read_step(tq, meta, "acc", before)
        torch.save({"fields": fields, "tags": tags, "kept": kept, "read": step}, out / "tq.pt")
        logger.note_batch_dict(1, {k: v for k, v in step.items() if k != "tokens"}, step["tokens"])
        tracking.log({"actor/entropy": 0.5}, step=1)
        tracking.finish(exit_code=0)
    finally:
        tq.close()
        ray.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))

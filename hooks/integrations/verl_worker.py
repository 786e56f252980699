"""Top-1 probability and ICT JS from inside verl's actor workers, where the full logits exist.

Only the old-log-prob pass asks for them (the driver sets `forksight_stats` on that batch): the
FSDP engine's `prepare_model_outputs` then also returns `forksight_top1` and `forksight_js`,
nested like its `entropy`, and verl's own RPC carries them back. The math is
`hooks.metrics.token_stats`, fed block by block over response positions so the extra memory
stays bounded (no copy of a micro-batch's logits). JS needs a group's n rollouts in one
micro-batch (`uid` travels with the rows): rows of groups split across micro-batches or ranks
get NaN ("not computed"), as do all rows when the logits are sharded (Ulysses SP, TP) or never
built (fused kernels).
"""
from __future__ import annotations

import logging

import torch

log = logging.getLogger("forksight.verl")

FLAG, GROUP_SIZE = "forksight_stats", "forksight_group_size"
_BLOCK_FLOATS = 1 << 25          # scratch per block, as in hooks.metrics: 128 MB of float32
_warned: set[str] = set()


def _lengths(micro_batch) -> tuple[list[int], list[int]]:
    """Prompt and response length of each row (no_padding_2_padding's rule)."""
    prompts, responses = micro_batch["prompts"], micro_batch["responses"]
    if prompts.is_nested:
        return prompts.offsets().diff().tolist(), responses.offsets().diff().tolist()
    attention = micro_batch["attention_mask"]
    width = prompts.shape[1]
    return attention[:, :width].sum(1).tolist(), attention[:, width:].sum(1).tolist()


def response_stats(row_logits: list[torch.Tensor], prompt_lens: list[int], response_lens: list[int],
                   temperature: float, groups: list | None, group_size: int) -> tuple[list, list]:
    """Per row, top-1 and JS (NaN where not computed) over its response tokens.

    row_logits[i]: [seq_len_i, V] over prompt + response; the response's k-th token is predicted
    at position prompt_len_i - 1 + k. A group is scored for JS when all group_size rows are here.
    """
    from forksight.hooks.metrics import token_stats

    nan = float("nan")
    top1 = [torch.full((r,), nan) for r in response_lens]
    js = [torch.full((r,), nan) for r in response_lens]
    by_group: dict = {}
    for row, key in enumerate(groups if groups is not None else range(len(row_logits))):
        by_group.setdefault(key, []).append(row)
    batches = []
    for rows in by_group.values():
        if groups is not None and group_size > 1 and len(rows) == group_size:
            batches.append((rows, True))
        else:
            batches.extend(([row], False) for row in rows)
    for rows, with_js in batches:
        longest = max(response_lens[i] for i in rows)
        if longest == 0:
            continue
        vocab = row_logits[rows[0]].shape[-1]
        step = max(1, _BLOCK_FLOATS // (len(rows) * vocab))
        for t0 in range(0, longest, step):
            t1 = min(longest, t0 + step)
            block = row_logits[rows[0]].new_zeros((len(rows), t1 - t0, vocab))
            mask = torch.zeros((len(rows), t1 - t0), dtype=torch.bool, device=block.device)
            for j, i in enumerate(rows):
                end = min(t1, response_lens[i])
                if end > t0:
                    start = prompt_lens[i] - 1
                    block[j, : end - t0] = row_logits[i][start + t0: start + end]
                    mask[j, : end - t0] = True
            stats = token_stats(block, mask=mask, temperature=temperature,
                                group_ids=[0] * len(rows) if with_js else None)
            for j, i in enumerate(rows):
                end = min(t1, response_lens[i])
                if end > t0:
                    top1[i][t0:end] = stats.top1[j, : end - t0].float().cpu()
                    if with_js:
                        js[i][t0:end] = stats.js[j, : end - t0].float().cpu()
    return top1, js


def engine_stats(engine, output, output_args, micro_batch) -> dict[str, torch.Tensor]:
    """forksight_top1 / forksight_js for one micro-batch, nested over prompt + response tokens."""
    from verl.utils import tensordict_utils as tu

    if tu.get_non_tensor_data(data=micro_batch, key="use_fused_kernels", default=False):
        raise RuntimeError("fused kernels build no logits")
    if getattr(engine, "use_ulysses_sp", False):
        raise RuntimeError("Ulysses sequence parallelism shards the logits")
    logits = output.logits
    if not isinstance(logits, torch.Tensor) or type(logits) is not torch.Tensor:
        raise RuntimeError(f"logits are a {type(logits).__name__} (tensor parallel)")
    cu_seqlens = micro_batch["input_ids"].offsets()
    seq_lens = cu_seqlens.diff().tolist()
    if tu.get_non_tensor_data(data=micro_batch, key="use_remove_padding", default=True):
        flat = logits.squeeze(0)
        rows = [flat[a:b] for a, b in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist())]
        temperature = float(output_args["temperature_rmpad"].reshape(-1)[0])
    else:
        rows = [logits[i, :n] for i, n in enumerate(seq_lens)]
        temperature = float(output_args["temperature"].reshape(-1)[0])
    prompt_lens, response_lens = _lengths(micro_batch)
    uid = micro_batch.get("uid", None) if hasattr(micro_batch, "get") else None
    groups = list(uid.tolist()) if uid is not None and hasattr(uid, "tolist") else None
    group_size = int(tu.get_non_tensor_data(data=micro_batch, key=GROUP_SIZE, default=0) or 0)
    with torch.no_grad():
        top1, js = response_stats(rows, prompt_lens, response_lens, temperature, groups, group_size)
    out = {}
    for name, values in (("forksight_top1", top1), ("forksight_js", js)):
        full = []
        for n, p, v in zip(seq_lens, prompt_lens, values):
            row = torch.zeros(n)
            row[p - 1: p - 1 + v.numel()] = v
            full.append(row)
        flat_values = torch.cat(full).to(cu_seqlens.device)
        out[name] = torch.nested.nested_tensor_from_jagged(flat_values, cu_seqlens)
    return out


def patch_fsdp_engine(module) -> None:
    """Wrap FSDPEngineWithLMHead.prepare_model_outputs (value heads override it: untouched)."""
    from verl.utils import tensordict_utils as tu

    engine_cls = module.FSDPEngineWithLMHead
    original = engine_cls.prepare_model_outputs

    def prepare_model_outputs(self, output, output_args, micro_batch, logits_processor_func):
        model_output = original(self, output, output_args, micro_batch, logits_processor_func)
        if tu.get_non_tensor_data(data=micro_batch, key=FLAG, default=False):
            try:
                model_output.update(engine_stats(self, output, output_args, micro_batch))
            except Exception as exc:  # noqa: BLE001 - never break the user's forward
                reason = str(exc)
                if reason not in _warned:
                    _warned.add(reason)
                    log.warning("forksight: no top-1/JS from this worker (%s)", reason)
        return model_output

    engine_cls.prepare_model_outputs = prepare_model_outputs


def padded(values, batch_td):
    """A worker's nested forksight_* values as [B, response_len] (verl's no_padding_2_padding)."""
    from verl.workers.utils.padding import no_padding_2_padding

    return no_padding_2_padding(values, batch_td).float()

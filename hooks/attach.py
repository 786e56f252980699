"""`hooks.attach(model, ...)`: forward hooks that turn what a model's forward already produced
into per-token statistics (entropy, Rényi-2, top-1, log p, ICT JS) and stream them to a sink.

Where the numbers come from (docs: ../shared/DESIGN.md "Where the per-token numbers come from"):
- logits: a hook on `model.get_output_embeddings()` sees [B, T, V] and computes at once (TRL
  ≤ 1.14 rescales those logits in place right after the forward);
- fused heads (TRL ≥ 1.15): the forward returns `entropy`, `log_probs` (and `log_sum_sq_probs`)
  instead of logits; a hook on the backbone keeps the hidden states so that a sample of groups
  gets full distributions (hidden × Wᵀ in chunks) for JS and top-1.
Everything runs under no_grad on detached tensors and no hook returns a value, so outputs and
gradients are untouched; forwards run without grad (generation, eval) are skipped.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from forksight.hooks import metrics

log = logging.getLogger("forksight.hooks")

# Training runs the LM head forward + backward (~3 passes per token); JS costs one more pass
# over the rows it covers, so js_budget is a fraction of those 3 passes.
_TRAIN_PASSES = 3.0


@dataclass
class _Record:
    """One training forward's per-token results, rows in forward order."""

    entropy: Tensor
    renyi2: Tensor
    top1: Tensor
    logp: Tensor
    js: Tensor
    mask: Tensor
    tokens: Tensor
    index: list[int]
    selected: Tensor | None = None


@dataclass
class _Pending:
    """Samples logged for a step that has not been reported yet."""

    rows: list[dict] = field(default_factory=list)


def _first_valid_column(mask: Tensor) -> int:
    """Index of the first column where any row is valid (completion start); 0 when none."""
    cols = mask.any(0).nonzero()
    return int(cols[0]) if cols.numel() else 0


def _as_text(x: Any) -> str:
    """Prompts/completions may be chat messages: show them as `role: content` lines."""
    if isinstance(x, str):
        return x
    if isinstance(x, (list, tuple)) and all(isinstance(m, dict) for m in x):
        return "\n".join(f"{m.get('role', '')}: {m.get('content', '')}" for m in x)
    return str(x)


class AttachHandle:
    """Hooks on one model plus the step buffer; a context manager, `detach()` removes all."""

    def __init__(self, model: torch.nn.Module, sink, *, tokenizer=None, owns_sink: bool = True,
                 group_size: int | None = None, sample: int = 1, every: int = 1,
                 js_groups: int | str | None = None, js_budget: float = 0.02,
                 temperature: float = 1.0, chunk_size: int = 1024,
                 optimizer: torch.optim.Optimizer | None = None, auto_step: bool = True,
                 start_step: int = 0):
        from forksight.hooks.report import StepReporter

        if every < 1:
            raise ValueError(f"every must be >= 1 (report every N-th step), got {every}")
        if group_size is not None and group_size < 1:
            raise ValueError(f"group_size must be >= 1 (completions per prompt), got {group_size}")
        if not (js_groups is None or js_groups == "all" or (isinstance(js_groups, int) and js_groups >= 0)):
            raise ValueError(f"js_groups must be None (budget), 'all' or an int >= 0, got {js_groups!r}")
        if not 0.0 <= js_budget <= 1.0:
            raise ValueError(f"js_budget is a fraction of the training LM-head work, in [0, 1]; got {js_budget}")
        self.model = model
        self.sink = sink
        self.owns_sink = owns_sink
        self.reporter = StepReporter(sink, tokenizer=tokenizer, token_groups=sample)
        self.group_size = group_size
        self.every = every
        self.js_groups = js_groups
        self.js_budget = js_budget
        self.temperature = temperature
        self.chunk_size = chunk_size
        self.auto_step = auto_step and optimizer is None
        self.step = start_step  # the step being accumulated
        self.enabled = True
        # set by integrations (TRL): map a forward's input_ids to sample indices / pick tokens trained
        self.row_index_fn: Callable[[Tensor], list[int] | None] | None = None
        self.selection_fn: Callable[[Tensor, Tensor], Tensor | None] | None = None
        self.num_rows: int | None = None  # size of the sample index space (TRL: generation batch)
        self._records: list[_Record] = []
        self._pending: dict[int, _Pending] = {}
        self._ctx: dict | None = None
        self._js_credit = 0.0
        self._warned: set[str] = set()
        self._handles: list = []
        self._attach_hooks(optimizer)

    # ------------------------------------------------------------------ hooks
    def _attach_hooks(self, optimizer) -> None:
        head = self.model.get_output_embeddings() if hasattr(self.model, "get_output_embeddings") else None
        if head is None:
            raise ValueError(
                f"{type(self.model).__name__} has no output embedding (get_output_embeddings() is None): "
                "attach needs a causal LM whose head produces logits over the vocabulary"
            )
        self.head = head
        backbone = getattr(self.model, "base_model", None)
        self._handles.append(self.model.register_forward_pre_hook(self._on_model_pre, with_kwargs=True))
        if backbone is not None and backbone is not self.model:
            self._handles.append(backbone.register_forward_hook(self._on_backbone))
        self._handles.append(head.register_forward_hook(self._on_head))
        self._handles.append(self.model.register_forward_hook(self._on_model, with_kwargs=True))
        if optimizer is not None:
            self._handles.append(optimizer.register_step_post_hook(lambda *_: self.flush()))

    def _watching(self) -> bool:
        # only forwards that train: generation, reference and old-logp passes run without grad
        return self.enabled and torch.is_grad_enabled()

    def _guard(self, fn, *args) -> None:
        """Run a hook body; a failure disables token stats with one warning, never the run."""
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - monitoring must never crash training
            self.enabled = False
            self._ctx = None
            log.warning("forksight: per-token statistics disabled after an error in a hook: %r", exc)

    def _on_model_pre(self, module, args, kwargs) -> None:
        if not self._watching():
            self._ctx = None
            return
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        self._ctx = {"input_ids": input_ids, "attention_mask": kwargs.get("attention_mask"),
                     "labels": kwargs.get("labels"), "hidden": None, "done": False}

    def _on_backbone(self, module, args, output) -> None:
        if self._ctx is not None:
            hidden = getattr(output, "last_hidden_state", None)
            self._ctx["hidden"] = hidden if hidden is not None else output[0]

    def _on_head(self, module, args, output) -> None:
        ctx = self._ctx
        if ctx is None or ctx["done"] or not isinstance(output, Tensor) or output.dim() != 3:
            return
        ctx["done"] = True
        self._guard(self._from_logits, ctx, output)

    def _on_model(self, module, args, kwargs, output) -> None:
        ctx, self._ctx = self._ctx, None
        if ctx is None or ctx["done"]:
            return
        if getattr(output, "entropy", None) is not None and getattr(output, "log_probs", None) is not None:
            self._guard(self._from_fused, ctx, kwargs, output)
        else:
            self._warn_once("nologits", "forksight: a training forward produced neither logits nor fused "
                            "entropy; no per-token statistics for it")

    # ------------------------------------------------------------------ per-forward stats
    def _rows(self, input_ids: Tensor) -> list[int]:
        index = self.row_index_fn(input_ids) if self.row_index_fn is not None else None
        if index is None:  # plain loop: rows in the order the forwards saw them
            offset = sum(len(r.index) for r in self._records)
            index = list(range(offset, offset + input_ids.shape[0]))
        return index

    def _group_of(self, index: list[int]) -> list[int] | None:
        if self.group_size is None:
            return None
        return [i // self.group_size for i in index]

    def _js_rows(self, groups: list[int] | None, n_tokens_per_row: list[int]) -> list[int]:
        """Rows that get full distributions this forward: whole groups, lowest group ids first."""
        if groups is None or self.js_groups == 0:
            return []
        order = sorted(set(g for g in groups if g >= 0))
        if self.js_groups == "all":
            chosen = order
        elif isinstance(self.js_groups, int):
            chosen = order[: self.js_groups]
        else:  # budget: credit grows with the tokens trained, a group costs its tokens
            self._js_credit += _TRAIN_PASSES * self.js_budget * sum(n_tokens_per_row)
            chosen = []
            for g in order:
                cost = sum(n for n, gg in zip(n_tokens_per_row, groups) if gg == g)
                if cost > self._js_credit:
                    break
                self._js_credit -= cost
                chosen.append(g)
        keep = set(chosen)
        return [r for r, g in enumerate(groups) if g in keep]

    def _from_logits(self, ctx: dict, logits: Tensor) -> None:
        input_ids = ctx["input_ids"]
        seq, kept = input_ids.shape[1], logits.shape[1]
        first = seq - kept + 1  # input position of the first target token
        tokens = input_ids[:, first:]
        mask = torch.ones_like(tokens, dtype=torch.bool)
        if ctx["attention_mask"] is not None:
            mask &= ctx["attention_mask"][:, first:].bool()
        if ctx["labels"] is not None:
            mask &= ctx["labels"][:, first:] != -100
        start = _first_valid_column(mask)
        z, tokens, mask = logits.detach()[:, :-1][:, start:], tokens[:, start:], mask[:, start:]
        index = self._rows(input_ids)
        groups = self._group_of(index)
        js_rows = self._js_rows(groups, mask.sum(1).tolist())
        with torch.no_grad():
            if groups is not None and len(js_rows) == len(index):
                stats = metrics.token_stats(z, mask=mask, tokens=tokens, temperature=self.temperature,
                                            group_ids=groups, chunk_size=self.chunk_size)
                js = stats.js
            else:
                stats = metrics.token_stats(z, mask=mask, tokens=tokens, temperature=self.temperature,
                                            chunk_size=self.chunk_size)
                js = torch.full_like(stats.entropy, float("nan"))
                if js_rows:
                    rows = torch.tensor(js_rows, device=z.device)
                    sub = metrics.token_stats(z[rows], mask=mask[rows], tokens=tokens[rows],
                                              temperature=self.temperature,
                                              group_ids=[groups[r] for r in js_rows], chunk_size=self.chunk_size)
                    js[rows] = sub.js
        self._store(stats.entropy, stats.renyi2, stats.top1, stats.logp, js, mask, tokens, index)

    def _from_fused(self, ctx: dict, kwargs: dict, out) -> None:
        labels = kwargs.get("labels")
        if labels is None:
            labels = kwargs.get("shift_labels")
            targets = labels
        else:
            targets = labels[:, 1:]
        mask = out.label_mask if getattr(out, "label_mask", None) is not None else targets != -100
        start = _first_valid_column(mask)
        mask = mask[:, start:]
        tokens = targets[:, start:].masked_fill(~mask, 0)
        with torch.no_grad():
            entropy = out.entropy.detach()[:, start:].float()
            logp = out.log_probs.detach()[:, start:].float()
            lssp = getattr(out, "log_sum_sq_probs", None)
            nan = torch.full_like(entropy, float("nan"))
            renyi2 = (-lssp.detach()[:, start:].float()).clamp(min=0.0) if lssp is not None else nan.clone()
            top1, js = nan.clone(), nan.clone()
            index = self._rows(ctx["input_ids"])
            groups = self._group_of(index)
            js_rows = self._js_rows(groups, mask.sum(1).tolist()) if ctx["hidden"] is not None else []
            if js_rows:
                self._full_rows(ctx["hidden"], start, js_rows, groups, mask, tokens, top1, js)
        self._store(entropy, renyi2, top1, logp, js, mask, tokens, index)

    def _full_rows(self, hidden, start, rows, groups, mask, tokens, top1, js) -> None:
        """hidden × Wᵀ (in chunks, inside metrics) for a few whole groups: JS and top-1."""
        config = getattr(self.model, "config", None)
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        if getattr(text, "final_logit_softcapping", None) or getattr(text, "logit_scale", None) not in (None, 1, 1.0):
            self._warn_once("softcap", "forksight: this model rescales or soft-caps its logits; JS and top-1 "
                            "from hidden states are skipped on the fused head")
            return
        r = torch.tensor(rows, device=hidden.device)
        h = hidden.detach()[:, :-1][:, start:][r]
        sub = metrics.token_stats(hidden=h, weight=self.head.weight, bias=self.head.bias,
                                  mask=mask[r], tokens=tokens[r], temperature=self.temperature,
                                  group_ids=[groups[i] for i in rows], chunk_size=self.chunk_size)
        top1[r] = sub.top1
        js[r] = sub.js

    def _store(self, entropy, renyi2, top1, logp, js, mask, tokens, index) -> None:
        selected = self.selection_fn(entropy, mask) if self.selection_fn is not None else None
        self._records.append(_Record(entropy, renyi2, top1, logp, js, mask, tokens, index, selected))
        if self.auto_step:
            self.flush()

    # ------------------------------------------------------------------ steps
    def log_samples(self, step: int | None, prompts: Sequence, completions: Sequence,
                    rewards: Sequence[float], correct: Sequence[bool] | None = None,
                    group_ids: Sequence[int] | None = None, *, sample_ids: Sequence[int] | None = None,
                    source: str = "") -> None:
        """Rewards and verdicts of a step's completions (pass@k, the completions view).

        step None means the step being accumulated; rows align with the forward's rows unless
        sample_ids says otherwise; group_ids default to sample_id // group_size.
        """
        n = len(completions)
        if not (len(prompts) == n == len(rewards)) or (correct is not None and len(correct) != n):
            raise ValueError(f"prompts, completions, rewards (and correct) need one entry per sample; got "
                             f"{len(prompts)}, {n}, {len(rewards)}" + ("" if correct is None else f", {len(correct)}"))
        ids = list(sample_ids) if sample_ids is not None else list(range(n))
        if group_ids is None:
            if self.group_size is None:
                raise ValueError("log_samples needs group_ids, or attach(..., group_size=G) to derive them")
            group_ids = [i // self.group_size for i in ids]
        if len(group_ids) != n or len(ids) != n:
            raise ValueError(f"group_ids and sample_ids need {n} entries each")
        rows = [{"sample_id": int(ids[i]), "group_id": int(group_ids[i]), "prompt": _as_text(prompts[i]),
                 "completion": _as_text(completions[i]), "reward": float(rewards[i]),
                 "correct": bool(correct[i]) if correct is not None else bool(float(rewards[i]) > 0),
                 "source": source} for i in range(n)]
        step = self.step if step is None else int(step)
        if step < self.step:  # that step was reported already: send the samples on their own
            self._send_samples(step, rows)
        else:
            self._pending.setdefault(step, _Pending()).rows.extend(rows)

    def _send_samples(self, step: int, rows: list[dict]) -> None:
        from forksight.hooks.report import group_scalars

        if not rows:
            return
        self.sink.log_samples(step, rows)
        self.sink.log_scalars(step, group_scalars([r["group_id"] for r in rows], [r["reward"] for r in rows],
                                                  [r["correct"] for r in rows]))

    def flush(self, step: int | None = None, extra: dict[str, float] | None = None,
              advantages: Sequence[float] | None = None) -> dict[str, float] | None:
        """Report the buffered forwards as one step (default: the step being accumulated).

        advantages are per sample index (TRL: the generation batch); returns the step's scalars.
        """
        step = self.step if step is None else int(step)
        records, self._records = self._records, []
        self.step = step + 1
        pending = self._pending.pop(step, None)
        if pending is not None:
            lengths = {i: int(n) for r in records for i, n in zip(r.index, r.mask.sum(1).tolist())}
            for row in pending.rows:
                if row.get("length") is None and row["sample_id"] in lengths:
                    row["length"] = lengths[row["sample_id"]]
            self._send_samples(step, pending.rows)
        for old in [s for s in self._pending if s < step]:  # samples for steps that never had a forward
            self._send_samples(old, self._pending.pop(old).rows)
        if not records or step % self.every:
            return None
        return self._report(step, records, extra, advantages)

    def _report(self, step: int, records: list[_Record], extra, advantages) -> dict[str, float]:
        width = max(r.mask.shape[1] for r in records)
        index = [i for r in records for i in r.index]
        size = max(max(index) + 1, self.num_rows or 0, len(index)) if index else 0
        device = records[0].mask.device

        def gather(name: str, fill, dtype) -> Tensor:
            out = torch.full((size, width), fill, dtype=dtype, device=device)
            for r in records:
                value = getattr(r, name)
                if value is None:
                    continue
                rows = torch.tensor(r.index, device=device)
                out[rows, : value.shape[1]] = value.to(dtype)
            return out

        mask = gather("mask", False, torch.bool)
        stats = metrics.TokenStats(
            entropy=gather("entropy", 0.0, torch.float32), renyi2=gather("renyi2", 0.0, torch.float32),
            top1=gather("top1", 0.0, torch.float32), logp=gather("logp", 0.0, torch.float32),
            js=gather("js", 0.0, torch.float32), mask=mask)
        tokens = gather("tokens", 0, torch.long)
        selected = gather("selected", False, torch.bool) if any(r.selected is not None for r in records) else None
        groups = self._group_of(list(range(size))) if self.group_size else None
        extra = dict(extra or {})
        seen = mask.any(1)
        if int(seen.sum()):
            extra.setdefault("length/mean", float(mask[seen].sum(1).float().mean()))
        for key, value in (("top1/mean", stats.top1), ("js/mean", stats.js)):
            known = mask & torch.isfinite(value)
            if int(known.sum()):
                extra.setdefault(key, float(value[known].double().mean()))
        adv = None
        if advantages is not None and len(advantages) >= size:
            adv = torch.as_tensor([float(a) for a in advantages[:size]], device=device)
        return self.reporter.report(step, stats, tokens, selected=selected, group_ids=groups,
                                    advantages=adv, extra=extra)

    def set_step(self, step: int) -> None:
        """Use your loop's step counter for the forwards that follow."""
        self.step = int(step)

    # ------------------------------------------------------------------ lifetime
    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message)

    def detach(self, finish: bool | None = None) -> None:
        """Remove every hook, report what is buffered, and finish the sink if attach opened it."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._records:
            self.flush()
        for step in sorted(self._pending):
            self._send_samples(step, self._pending.pop(step).rows)
        if self.owns_sink if finish is None else finish:
            self.sink.finish()

    def __enter__(self) -> "AttachHandle":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.detach(finish=False)
        if self.owns_sink:
            self.sink.finish(status="crashed" if exc_type else "finished")


def attach(model: torch.nn.Module, run: str = "run", *, url: str | None = None, db: str | None = None,
           sink=None, tokenizer=None, sample: int = 1, every: int = 1, group_size: int | None = None,
           js_groups: int | str | None = None, js_budget: float = 0.02, temperature: float = 1.0,
           chunk_size: int = 1024, optimizer: torch.optim.Optimizer | None = None,
           project: str = "default", stop_on_alert: bool = False, config: dict | None = None) -> AttachHandle:
    """Watch any HF causal LM / PyTorch LM: per-token stats of every training forward go to forksight.

    One step per training forward (or per `optimizer.step()` when optimizer is given); rewards
    and verdicts join with `handle.log_samples(...)`. `sample` groups keep per-token rows per step.
    """
    from forksight.monitor.client import open_sink

    owns = sink is None
    if sink is None:
        sink = open_sink(run=run, url=url, db=db, project=project, stop_on_alert=stop_on_alert,
                         model=getattr(getattr(model, "config", None), "_name_or_path", None) or type(model).__name__,
                         config={"vocab_size": getattr(getattr(model, "config", None), "vocab_size", None),
                                 **(config or {})})
    return AttachHandle(model, sink, tokenizer=tokenizer, owns_sink=owns, group_size=group_size, sample=sample,
                        every=every, js_groups=js_groups, js_budget=js_budget, temperature=temperature,
                        chunk_size=chunk_size, optimizer=optimizer)

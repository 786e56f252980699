"""`forksight.attach(model, ...)`: forward hooks turn what a training forward already produced (logits, or a
fused head's entropy/log p plus hidden states × W for sampled groups) into per-token statistics and stream
them; no_grad, detached, no hook returns a value (DESIGN.md "Where the per-token numbers come from")."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import Tensor

from forksight.base.interfaces import Sink
from forksight.base.fork_rule import ForkRule
from forksight.base.runspec import RunSpec
from forksight.hooks.capture.forward import ForwardCapture
from forksight.hooks.capture.forward_stats import ForwardRecord, ForwardStats
from forksight.hooks.capture.report import StepReporter
from forksight.hooks.capture.sample_log import SampleLog, sample_rows
from forksight.hooks.capture.step_buffer import StepBuffer


@dataclass(frozen=True)
class Integration:
    """What a trainer integration (TRL) knows about its training forwards, handed to AttachHandle at
    construction. Plain `forksight.attach` needs none of it: rows in order, every token the model's."""

    # input_ids -> sample index of each row (TRL: rows of the generation batch); None: rows in order
    row_index: Callable[[Tensor], list[int] | None] | None = None
    # (sample indices, width) -> [B, width] bool of tokens an environment wrote (tool output), right-aligned
    env_mask: Callable[[list[int], int], Tensor | None] | None = None
    # (entropy, mask) -> the tokens the trainer trains on
    selection: Callable[[Tensor, Tensor], Tensor | None] | None = None
    # -> the size of the sample index space now (TRL: the generation batch), or None
    num_rows: Callable[[], int | None] | None = None
    # the trainer logs the mean of its per-micro-batch means (TRL): compare like with like
    per_forward_means: bool = False
    # (sample indices, width) -> [B, width] float32 log p of each token under the inference engine that
    # sampled it (NaN unknown), right-aligned with the forward's completion columns like env_mask
    sampler_logp: Callable[[list[int], int], Tensor | None] | None = None
    # (sample indices, width) -> [B, width] bool: tokens the run's own mismatch correction truncated/masked
    corrected: Callable[[list[int], int], Tensor | None] | None = None


class AttachHandle:
    """Hooks on one model, a context manager (`detach()` removes all). Stages: ForwardCapture (hooks) →
    ForwardStats (per forward) → StepBuffer (a step as one batch) → StepReporter; SampleLog holds rewards."""

    def __init__(self, model: torch.nn.Module, sink: Sink, *, tokenizer=None, owns_sink: bool = True,
                 group_size: int | None = None, sample: int = 1, every: int = 1,
                 js_groups: int | str | None = None, js_budget: float = 0.02,
                 temperature: float = 1.0, chunk_size: int = 1024,
                 optimizer: torch.optim.Optimizer | None = None, auto_step: bool = True,
                 start_step: int = 0, integration: Integration = Integration(),
                 fork_rule: "ForkRule | str | None" = None):
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
        self.reporter = StepReporter(sink, tokenizer=tokenizer, token_groups=sample, fork_rule=fork_rule)
        self.group_size = group_size
        self.every = every
        self.auto_step = auto_step and optimizer is None
        self.step = start_step  # the step being accumulated
        self.integration = integration
        self.buffer = StepBuffer(num_rows=integration.num_rows)
        self.samples = SampleLog(sink)
        self.capture = ForwardCapture(model, on_logits=self._on_logits, on_fused=self._on_fused,
                                      optimizer=optimizer, on_optimizer_step=self.flush)
        self.stats = ForwardStats(model, self.capture.head, group_size=group_size, js_groups=js_groups,
                                  js_budget=js_budget, temperature=temperature, chunk_size=chunk_size,
                                  warn_once=self.capture.warn_once, row_index_fn=integration.row_index,
                                  env_mask_fn=integration.env_mask, selection_fn=integration.selection,
                                  sampler_logp_fn=integration.sampler_logp, corrected_fn=integration.corrected)
        self._sampler: dict[int, tuple[Tensor, Tensor | None]] = {}  # sample index -> (log p, corrected)
        self.fork_rule, self.temperature, self.tokenizer = fork_rule, temperature, tokenizer
        self.reference = None         # hooks.capture.reference.ReferenceScorer, once set_reference is called

    @property
    def enabled(self) -> bool:
        """Per-token capture on/off at run time (an integration's switch; the benchmark toggles it)."""
        return self.capture.enabled

    @enabled.setter
    def enabled(self, on: bool) -> None:
        self.capture.enabled = on

    # ------------------------------------------------------------------ forwards
    def _on_logits(self, ctx: dict, logits: Tensor) -> None:
        self._add(self.stats.from_logits(ctx, logits, self.buffer.rows_seen()))

    def _on_fused(self, ctx: dict, kwargs: dict, out) -> None:
        self._add(self.stats.from_fused(ctx, kwargs, out, self.buffer.rows_seen()))

    def _add(self, record: ForwardRecord) -> None:
        if record.sampler_logp is None and self._sampler:
            self._place_sampler(record)
        self.buffer.add(record)
        if self.auto_step:
            self.flush()

    # ------------------------------------------------------------------ steps
    def log_samples(self, step: int | None, prompts: Sequence, completions: Sequence,
                    rewards: Sequence[float], correct: Sequence[bool] | None = None,
                    group_ids: Sequence[int] | None = None, *, sample_ids: Sequence[int] | None = None,
                    source: str = "", scalars: bool = True) -> None:
        """Rewards and verdicts of a step's completions (step None: the one being accumulated); rows align
        with the forward's rows unless sample_ids says otherwise, group_ids default to sample_id //
        group_size; scalars=False stores rows only (reward/pass@k logged elsewhere, e.g. by rank 0)."""
        rows = sample_rows(prompts, completions, rewards, correct, group_ids, sample_ids, self.group_size, source)
        self.samples.add(self.step if step is None else int(step), rows, self.step, scalars)

    def log_sampler_logp(self, sampler_logp, sample_ids: Sequence[int] | None = None,
                         corrected=None) -> None:
        """The inference engine's log p of each sampled completion token, for the forwards to come in this
        step: one row per sample (a list of 1-D sequences, or a [B, T] tensor whose row i starts with
        sample i's completion tokens in order; extra columns are padding). sample_ids default to rows
        0, 1, ... of the step, as the forwards see them. corrected (same shape, bool): tokens your own
        correction (truncated/masked importance sampling) changed. Row i's values land on the i-th
        forward row's completion tokens in order; a row shorter than its completion is warned about
        and stored as null."""
        rows = [torch.as_tensor(r, dtype=torch.float32).reshape(-1) for r in sampler_logp]
        fixed = [None] * len(rows) if corrected is None else [torch.as_tensor(c).bool().reshape(-1) for c in corrected]
        ids = range(len(rows)) if sample_ids is None else [int(i) for i in sample_ids]
        if len(ids) != len(rows) or len(fixed) != len(rows):
            raise ValueError(f"log_sampler_logp: {len(rows)} rows of log p, {len(ids)} sample ids and "
                             f"{len(fixed)} corrected rows: give one of each per sample")
        self._sampler.update(zip(ids, zip(rows, fixed)))

    def _place_sampler(self, record: ForwardRecord) -> None:
        """Row i's logged sampler log p on its forward row's model tokens, in order (any padding)."""
        sampler = torch.full(record.mask.shape, float("nan"))
        corrected = torch.zeros(record.mask.shape, dtype=torch.bool)
        any_fixed = False
        mask = record.mask.cpu()
        for r, i in enumerate(record.index):
            values, fixed = self._sampler.pop(i, (None, None))
            cols = mask[r].nonzero().flatten()
            if values is None or not cols.numel():
                continue
            if values.numel() < cols.numel():
                self.capture.warn_once("sampler_short", f"forksight: sample {i} has {values.numel()} sampler log p "
                                       f"value(s) for {cols.numel()} completion tokens: give one per token; "
                                       "such rows are stored without a sampler log p")
                continue
            sampler[r, cols] = values[: cols.numel()]
            if fixed is not None and fixed.numel() >= cols.numel():
                corrected[r, cols] = fixed[: cols.numel()]
                any_fixed = True
        record.sampler_logp = sampler.to(record.mask.device)
        record.corrected = corrected.to(record.mask.device) if any_fixed else None

    def flush(self, step: int | None = None, extra: dict[str, float] | None = None,
              advantages: Sequence[float] | None = None) -> dict[str, float] | None:
        """Report the buffered forwards as one step (default: the step being accumulated).

        advantages are per sample index (TRL: the generation batch); returns the step's scalars.
        """
        step = self.step if step is None else int(step)
        records = self.buffer.take()
        self._sampler.clear()   # rows logged for this step that no forward showed
        self.step = step + 1
        lengths = {i: int(n) for r in records for i, n in zip(r.index, r.mask.sum(1).tolist())}
        self.samples.release(step, lengths)
        if not records or step % self.every:
            return None
        return self.buffer.report(self.reporter, step, records, group_size=self.group_size, extra=extra,
                                  advantages=advantages, per_forward_means=self.integration.per_forward_means)

    # ------------------------------------------------------------------ the reference set
    def set_reference(self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]) -> None:
        """Keep a fixed reference set, as token ids (one completion per prompt, e.g. your base policy's
        answers to held-out prompts), for `rescore` to re-score through training. Set it once: a
        reference set is never replaced silently."""
        from forksight.hooks.capture.reference import ReferenceScorer
        from forksight.hooks.metrics.reference import ReferenceSet

        if self.reference is not None:
            raise ValueError("this run already has a reference set: it is kept for the whole run (a new set "
                             "would make its ref/* figures incomparable); start a new run for another")
        ref = ReferenceSet([[int(t) for t in p] for p in prompts], [[int(t) for t in c] for c in completions])
        pad = getattr(self.tokenizer, "pad_token_id", None)
        self.reference = ReferenceScorer(self.sink, ref, fork_rule=self.fork_rule, temperature=self.temperature,
                                         decode=(lambda t: self.tokenizer.decode([t])) if self.tokenizer else None,
                                         budget=None, pad_id=pad if pad is not None else 0)

    def rescore(self, model: torch.nn.Module | None = None, step: int | None = None) -> dict[str, float]:
        """Re-score the reference set, teacher-forced, with `model` (default: the attached one) as the policy
        of `step` (default: the step being accumulated): its rows and the ref/* scalars, returned. The first
        call is the base the others are compared with: call it before training."""
        if self.reference is None:
            raise ValueError("no reference set: call handle.set_reference(prompt_ids, completion_ids) first")
        was = self.capture.enabled
        self.capture.enabled = False           # the scoring forward is not a training forward
        try:
            return self.reference.rescore(model if model is not None else self.model,
                                          self.step if step is None else int(step))
        finally:
            self.capture.enabled = was

    # ------------------------------------------------------------------ lifetime
    def detach(self, finish: bool | None = None) -> None:
        """Remove every hook, report what is buffered, and finish the sink if attach opened it."""
        self.capture.remove()
        if self.buffer.records:
            self.flush()
        self.samples.drain()
        if self.owns_sink if finish is None else finish:
            self.sink.finish()

    def __enter__(self) -> "AttachHandle":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.detach(finish=False)
        if self.owns_sink:
            self.sink.finish(status="crashed" if exc_type else "finished")


def attach(model: torch.nn.Module, run: str | RunSpec = "run", *, url: str | None = None, db: str | None = None,
           sink: Sink | None = None, tokenizer=None, sample: int = 1, every: int = 1, group_size: int | None = None,
           js_groups: int | str | None = None, js_budget: float = 0.02, temperature: float = 1.0,
           chunk_size: int = 1024, optimizer: torch.optim.Optimizer | None = None,
           project: str | None = None, stop_on_alert: bool = False, config: dict | None = None,
           fork_rule: str | None = None) -> AttachHandle:
    """Watch any HF causal LM / PyTorch LM: per-token stats of every training forward go to forksight.

    One step per training forward (or per `optimizer.step()` when optimizer is given); rewards
    and verdicts join with `handle.log_samples(...)`. `sample` groups keep per-token rows per step.
    `run`: a name or a RunSpec; project/stop_on_alert/config given here replace the spec's.
    `fork_rule`: `abs:τ` or `top:q` (forksight.base.fork_rule; default abs:0.672), recorded in the config.
    """
    from forksight.monitor.sinks.client import open_sink

    rule = ForkRule.parse(fork_rule)          # a bad rule: said before any sink opens
    owns = sink is None
    if sink is None:
        spec = RunSpec.of(run, project=project, stop_on_alert=stop_on_alert or None, config=config).filled(
            model=getattr(getattr(model, "config", None), "_name_or_path", None) or type(model).__name__,
            config={"vocab_size": getattr(getattr(model, "config", None), "vocab_size", None),
                    "fork_rule": str(rule)})
        sink = open_sink(spec, url=url, db=db)
    return AttachHandle(model, sink, tokenizer=tokenizer, owns_sink=owns, group_size=group_size, sample=sample,
                        every=every, js_groups=js_groups, js_budget=js_budget, temperature=temperature,
                        chunk_size=chunk_size, optimizer=optimizer, fork_rule=rule)

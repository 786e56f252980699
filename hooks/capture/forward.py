"""Hook placement: `ForwardCapture` hands each TRAINING forward's output (LM-head logits, or a fused
head's entropy/log-probs with the backbone's hidden states) to a consumer and computes nothing. No
hook returns a value (outputs and gradients untouched); forwards without grad are skipped."""
from __future__ import annotations

import logging
from typing import Callable

import torch
from torch import Tensor

log = logging.getLogger("forksight.hooks")


class ForwardCapture:
    """Forward hooks on a causal LM; `remove()` takes them all off again."""

    def __init__(self, model: torch.nn.Module, *, on_logits: Callable[[dict, Tensor], None],
                 on_fused: Callable[[dict, dict, object], None],
                 optimizer: torch.optim.Optimizer | None = None, on_optimizer_step: Callable[[], None] | None = None):
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if head is None:
            raise ValueError(
                f"{type(model).__name__} has no output embedding (get_output_embeddings() is None): "
                "attach needs a causal LM whose head produces logits over the vocabulary"
            )
        self.model, self.head = model, head
        self.on_logits, self.on_fused = on_logits, on_fused
        self.enabled = True
        self._ctx: dict | None = None
        self._warned: set[str] = set()
        backbone = getattr(model, "base_model", None)
        self._handles = [model.register_forward_pre_hook(self._on_model_pre, with_kwargs=True)]
        if backbone is not None and backbone is not model:
            self._handles.append(backbone.register_forward_hook(self._on_backbone))
        self._handles.append(head.register_forward_hook(self._on_head))
        self._handles.append(model.register_forward_hook(self._on_model, with_kwargs=True))
        if optimizer is not None and on_optimizer_step is not None:
            self._handles.append(optimizer.register_step_post_hook(lambda *_: on_optimizer_step()))

    def _watching(self) -> bool:
        return self.enabled and torch.is_grad_enabled()

    def _guard(self, fn, *args) -> None:
        """Run a consumer; a failure disables token stats with one warning, never the run."""
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - monitoring must never crash training
            self.enabled = False
            self._ctx = None
            log.warning("forksight: per-token statistics disabled after an error in a hook: %r", exc)

    def warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message)

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
        ctx["done"] = True  # TRL ≤ 1.14 rescales these logits in place right after: compute now
        self._guard(self.on_logits, ctx, output)

    def _on_model(self, module, args, kwargs, output) -> None:
        ctx, self._ctx = self._ctx, None
        if ctx is None or ctx["done"]:
            return
        if getattr(output, "entropy", None) is not None and getattr(output, "log_probs", None) is not None:
            self._guard(self.on_fused, ctx, kwargs, output)
        else:
            self.warn_once("nologits", "forksight: a training forward produced neither logits nor fused "
                           "entropy; no per-token statistics for it")

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

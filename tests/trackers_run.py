"""A real GRPOTrainer run (tiny model, CPU) reporting to W&B (offline), trackio, MLflow and TensorBoard,
all writing local files under $FORKSIGHT_TRACKERS_DIR, with forksight attached (its mirror on by
default) and an alert configured to fire from step 2 (a collapse floor above the untrained model's
entropy). Run as a script by tests/test_trackers.py, so each tracker's process-wide state and its
environment (set before any tracker is imported) stay out of the test process.

    python tests/trackers_run.py MODEL_DIR OUT_DIR [mirror]"""
from __future__ import annotations

import os
import sys


def main(model_path: str, out: str, mirror: str = "auto") -> None:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    import forksight.trl
    from forksight.compose.local import LocalSink
    from forksight.monitor.alerts.hub import AlertConfig, AlertHub, CollapseConfig
    from forksight.monitor.collector.store import Store
    from forksight.trainer.model import load

    model, tokenizer = load(model_path)

    def even_first_token(completions, completion_ids, **kwargs):
        return [1.0 if ids and ids[0] % 2 == 0 else 0.0 for ids in completion_ids]

    config = GRPOConfig(
        output_dir=os.path.join(out, "trl"), report_to=["wandb", "trackio", "mlflow", "tensorboard"],
        run_name="mirrored", project="forksight-test",
        trackio_static_space_id=False, use_cpu=True, bf16=False, seed=0, per_device_train_batch_size=8,
        num_generations=4, max_completion_length=6, learning_rate=5e-3, max_steps=4, logging_steps=1,
        save_strategy="no", disable_tqdm=True)
    data = Dataset.from_list([{"prompt": f"Q: {10 + i}+{20 + i}= A:"} for i in range(32)])
    trainer = GRPOTrainer(model=model, args=config, reward_funcs=even_first_token, train_dataset=data,
                          processing_class=tokenizer)
    db = os.path.join(out, "runs.duckdb")
    hub = AlertHub(AlertConfig(collapse=CollapseConfig(floor=50.0, warmup_steps=2, baseline_steps=1, persist=1)))
    store = Store(db)
    sink = LocalSink(db, "mirrored", store=store, hub=hub, config={"vocab_size": 311})
    callback = forksight.trl.attach(trainer, sink=sink, sample=2, mirror=mirror, mirror_tokens_every=2)
    trainer.train()
    callback.detach()
    sink.finish()
    store.close()
    import wandb

    if wandb.run is not None:
        wandb.finish()


if __name__ == "__main__":
    main(*sys.argv[1:])

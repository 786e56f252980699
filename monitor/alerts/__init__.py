"""forksight.monitor.alerts: the detectors, their settings, the per-run hub and the webhook.
Alerting reads records, never HTTP."""

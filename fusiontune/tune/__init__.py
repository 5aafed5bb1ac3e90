"""Tuning: evaluators (local, Ray, external command, replay), the optuna loop, storage and resume."""

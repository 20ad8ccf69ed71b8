"""Adapters that map training frameworks' hooks onto the worker SDK (optional extras: hf, lightning)."""

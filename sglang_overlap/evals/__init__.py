"""Accuracy checks against running servers (pure Python + HTTP; no torch, no sglang)."""

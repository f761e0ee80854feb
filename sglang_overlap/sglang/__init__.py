"""Glue to SGLang 0.5.23: the only package that imports sglang."""

SGLANG_VERSION = "0.5.23"

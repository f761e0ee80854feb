"""The `sglang-overlap` command line."""

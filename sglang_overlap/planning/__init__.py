"""Pure-Python planning: how to split a batch, cut a request, lay out SBO signals, and what each
mode is predicted to cost. No torch, no sglang."""

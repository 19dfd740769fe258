"""Advantage fns in modules of their own, registered in `ADVANTAGE_FN` and imported on first use."""

"""Bisect a kernel drift by pinned revision: by the command's exit code (by_revision) or by a figure it
prints (by_metric), each probed commit staged and handed over as its own LOCAL_KERNELS (pin).

May import: store, stage, views, and the flat modules of frt.mirror.
"""

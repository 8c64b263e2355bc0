"""What the offline cluster reads off a staged home: LOCAL_KERNELS for a target (env), a Hugging Face Hub
cache that works with HF_HUB_OFFLINE=1 (hfcache, kept in step with withdrawals by hfcache_prune), and
the variant folders written out of an object store, which has no view trees (materialise).

May import: store, and the flat modules of frt.mirror.
"""

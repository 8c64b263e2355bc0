"""frt.mirror — blob store, stage, verify, offline views, serve, and the frt-mirror CLI."""

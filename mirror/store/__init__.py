"""The content-addressed store and what keeps it true: blobs by sha256 on a filesystem (blobs) or an
object store (s3), their rows in the ledger (records, withdrawn), the `Home` that holds a ledger, a
store and the build/<variant> trees hard-linked into it (home, view_trees), the home-wide lock (lock),
and verify, gc and unstage.

May import: the flat modules of frt.mirror (home_path, schema, events). No other room.
"""

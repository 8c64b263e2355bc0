"""The content-addressed store and what keeps it true: one BlobStore protocol (protocol) kept by blobs by
sha256 on a filesystem (files) or an object store (s3), with what they share (blobs: a blob's digests and
name; scratch: this host's parts and locks), their rows in the ledger (records, withdrawn), the `Home`
that holds a ledger, chooses a store, and holds the build/<variant> trees hard-linked into its files
(home, view_trees), the home-wide lock (lock), and verify, gc and unstage.

May import: the flat modules of frt.mirror (home_path, schema, events). No other room.
"""

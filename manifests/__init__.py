"""frt.manifests — manifest and seat-catalog schema and parsing. Not built yet (issue: Stage)."""

"""The CI side: the cost gate on a committed plan (gate), plan diffs (diff), and their report formats (report)."""

"""One module per upstream format, plus the plumbing they share (the JSONL tailer)."""

"""OpenClaw, the gateway: where an install keeps its state (:mod:`.home`, the one module that
knows it) and what the sidecar reads of its files (:mod:`.files`: its configuration, its
hooks and token, its state database and transcripts). Nothing is imported here, so that a
one-shot command that only finds the store loads :mod:`.home` alone."""

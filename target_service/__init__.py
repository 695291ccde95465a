"""The target worker: owns every sequence (committed tokens, KV cache, version) and verifies drafts."""

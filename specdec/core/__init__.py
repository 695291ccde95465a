"""Pure algorithms of speculative decoding (torch only): sampling, draft trees, verification, KV commit."""

"""The router: the public Generation API. Tokenizes, validates, queues, assigns workers, streams back.

It imports no torch: tokenization uses `tokenizers` and chat templates are rendered with jinja2.
"""

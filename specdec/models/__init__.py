"""Loading targets and drafters: the embedded default or any local Hugging Face checkpoint directory."""

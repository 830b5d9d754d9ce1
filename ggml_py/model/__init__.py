"""llama models: the GGUF file's config and weights, the forward graph, the KV cache, sampling, and `Llama`."""

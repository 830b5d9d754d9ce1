"""Command-line programs: ggml-main (text generation) and ggml-perplexity."""

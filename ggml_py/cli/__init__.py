"""Command-line programs: every console script's main (ggml-main, ggml-perplexity, ggml-bench, ggml-tune, ggml-quantize, ggml-convert), thin over the library."""

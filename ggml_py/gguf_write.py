"""What every llama GGUF this project writes carries (convert, random models)."""
import gguf


def add_llama_hparams(writer, *, n_vocab, n_ctx, n_embd, n_layer, n_ff, n_head, n_head_kv,
                      rms_eps, rope_freq_base, rope_dim, rope_scale_linear=None):
    """The `llama.*` hyper-parameters, under llama.cpp's key names."""
    writer.add_vocab_size(n_vocab)
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_layer_norm_rms_eps(rms_eps)
    writer.add_rope_freq_base(rope_freq_base)
    writer.add_rope_dimension_count(rope_dim)
    if rope_scale_linear:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope_scale_linear)

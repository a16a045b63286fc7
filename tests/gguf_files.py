"""Small GGUF files that tests write themselves, as llama.cpp's convert_hf_to_gguf.py writes a Llama: a tiny random
transformers LlamaForCausalLM, its tensors under GGUF's names (gguf's own name map) with q and k rows permuted
into llama.cpp's RoPE layout, its architecture under the `llama.` keys, and a byte-level BPE tokenizer (trained
here on a few sentences) under the `tokenizer.ggml.` keys that transformers' GGUF tokenizer converter reads."""

from pathlib import Path

import numpy as np
import torch

LAYERS, HIDDEN, FFN, HEADS, KV_HEADS, POSITIONS = 2, 64, 128, 4, 2, 64
RMS_EPS, ROPE_BASE = 1e-5, 10000.0
END = "<|endoftext|>"
TEXT = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog.\n",
    "for i in range(10):\n    print(i * i)\n",
    "import os\nprint(os.path.join('a', 'b'))\n",
] * 8


def bpe_tokenizer(vocab_size: int = 300):
    """A byte-level BPE tokenizer trained on TEXT: its tokens by id, its merges ("a b") and its special END."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(TEXT, trainer)
    import json

    model = json.loads(tokenizer.to_str())["model"]
    tokens = [token for token, _ in sorted(model["vocab"].items(), key=lambda item: item[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, merges


def llama_model(vocab_size: int, seed: int, tie: bool):
    """A tiny random LlamaForCausalLM (every weight random, norm gains too), in eval mode."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=POSITIONS,
        rms_norm_eps=RMS_EPS,
        rope_theta=ROPE_BASE,
        tie_word_embeddings=tie,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's permutation of q or k rows (convert_hf_to_gguf.py's LlamaModel.permute): each head's halves
    (i, i + h/2) to pairs (2i, 2i + 1)."""
    return (
        weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def write_llama_gguf(
    path: Path, seed: int = 0, tie: bool = True, quantized: dict[str, str] | None = None, architecture: str = "llama"
):
    """Write a tiny Llama as a GGUF file at `path`; returns the transformers model it holds. `quantized`: GGUF
    tensor name -> a quantized type (e.g. {"blk.0.ffn_up.weight": "Q8_0"}), those tensors written in it through
    gguf's quants module, the rest in F32. `architecture`: the general.architecture written (the tensors and keys
    stay Llama's), to make a file of an architecture the reader refuses."""
    import gguf

    tokens, merges = bpe_tokenizer()
    model = llama_model(len(tokens), seed, tie)
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny-llama")
    writer.add_block_count(LAYERS)
    writer.add_context_length(POSITIONS)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_rope_freq_base(ROPE_BASE)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t == END else gguf.TokenType.NORMAL for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index(END))
    writer.add_eos_token_id(tokens.index(END))
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, LAYERS)
    for hf_name, tensor in model.state_dict().items():
        if tie and hf_name == "lm_head.weight":
            continue  # llama.cpp writes output.weight only where it is not the embedding
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert name is not None, hf_name
        data = tensor.detach().numpy().astype(np.float32)
        if name.endswith("attn_q.weight"):
            data = permute(data, HEADS)
        elif name.endswith("attn_k.weight"):
            data = permute(data, KV_HEADS)
        kind = (quantized or {}).get(name)
        if kind is None:
            writer.add_tensor(name, data)
        else:
            qtype = gguf.GGMLQuantizationType[kind]
            writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model

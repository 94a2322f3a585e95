"""A tiny llama-architecture GGUF whose greedy answer is known: built by the tests, no download.

Every attention and feed-forward weight is zero, so the residual stream at a position is its token's embedding; the
embeddings are one-hot, so the output matrix alone decides the next token from the current one. The chain after the
chat template's last token ("\\n") spells ``OK [1]`` and then ends the turn: a wiring check (template, tokenizer,
streaming, stop), not a language model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

ANSWER = "OK [1]"
# ChatML as Qwen writes it; the generation prompt is an expression, since Jinja drops a template's final newline
TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
            "'<|im_end|>\\n' }}{% endfor %}{{ '<|im_start|>assistant\\n' }}")


def _byte_symbols() -> list[str]:
    """GPT-2's byte-to-unicode table: the byte-level BPE vocabulary's spelling of each byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    codes, extra = printable[:], 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    table = dict(zip(printable, codes))
    return [chr(table[byte]) for byte in range(256)]


def build(path: Path, context: int = 2048) -> Path:
    import gguf

    symbols = _byte_symbols()
    # llama.cpp needs at least one merge; this one joins two control bytes that no test text holds
    merge = symbols[1] + symbols[2]
    tokens = symbols + ["<|im_start|>", "<|im_end|>", "<|endoftext|>", merge]
    im_end, eot = 257, 258  # <|im_start|> is 256
    vocab, dim, heads, ffn = len(tokens), 272, 4, 32
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("kbflow-test-tiny")
    writer.add_context_length(context)
    writer.add_embedding_length(dim)
    writer.add_block_count(1)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(heads)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_dimension_count(dim // heads)
    writer.add_vocab_size(vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.NORMAL] * 256 + [gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.NORMAL])
    writer.add_token_merges([f"{symbols[1]} {symbols[2]}"])
    writer.add_bos_token_id(eot)
    writer.add_eos_token_id(im_end)
    writer.add_add_bos_token(False)
    writer.add_chat_template(TEMPLATE)

    embeddings = np.zeros((vocab, dim), dtype=np.float32)
    embeddings[np.arange(vocab), np.arange(vocab)] = 1.0
    output = np.zeros((vocab, dim), dtype=np.float32)
    ids = {char: symbols[ord(char)] for char in "\nOK [1]"}
    chain = ["\n", *ANSWER]
    for current, following in zip(chain, chain[1:]):
        output[symbols.index(ids[following]), symbols.index(ids[current])] = 1.0
    for token in range(vocab):  # every other token ends the turn
        if not output[:, token].any():
            output[im_end, token] = 1.0
    writer.add_tensor("token_embd.weight", embeddings)
    writer.add_tensor("output_norm.weight", np.ones(dim, dtype=np.float32))
    writer.add_tensor("output.weight", output)
    zeros = {"attn_q": (dim, dim), "attn_k": (dim, dim), "attn_v": (dim, dim), "attn_output": (dim, dim),
             "ffn_gate": (ffn, dim), "ffn_up": (ffn, dim), "ffn_down": (dim, ffn)}
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(dim, dtype=np.float32))
    writer.add_tensor("blk.0.ffn_norm.weight", np.ones(dim, dtype=np.float32))
    for name, shape in zeros.items():
        writer.add_tensor(f"blk.0.{name}.weight", np.zeros(shape, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path

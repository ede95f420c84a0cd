"""A tiny random Llama with a byte-level tokenizer, built from a config: deterministic per seed, for tests."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from streamrl.models.quiet import no_progress_bars

# ChatML; with `tools` (apply_chat_template(..., tools=...)) a Hermes/Qwen-style tools block opens the chat,
# assistant tool calls render as <tool_call>{json}</tool_call> and tool results as `tool` turns. Chats
# without tools or tool calls render exactly as plain ChatML.
CHATML = "".join(
    [
        "{%- if tools %}{{- '<|im_start|>system\\n' }}",
        "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}",
        "{{- '# Tools\\n\\nYou may call functions. Their signatures are in <tools></tools>:\\n<tools>' }}",
        "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}",
        '{{- \'\\n</tools>\\n\\nFor each call, reply with <tool_call>\\n{"name": <function-name>, '
        '"arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n\' }}{%- endif %}',
        "{%- for message in messages %}",
        "{%- if not (tools and loop.first and message['role'] == 'system') %}",
        "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') }}",
        "{%- if message['role'] == 'assistant' and message['tool_calls'] %}",
        "{%- for call in message['tool_calls'] %}",
        "{%- set fn = call['function'] if call['function'] is defined else call %}",
        "{%- set args = fn['arguments'] if fn['arguments'] is string else fn['arguments'] | tojson %}",
        "{{- ('\\n' if (message['content'] or not loop.first) else '') + '<tool_call>\\n{\"name\": \"' "
        "+ fn['name'] + '\", \"arguments\": ' + args + '}\\n</tool_call>' }}",
        "{%- endfor %}{%- endif %}",
        "{{- '<|im_end|>\\n' }}{%- endif %}",
        "{%- endfor %}",
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}",
    ]
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def build_tokenizer():
    """Byte-level BPE with no merges: 256 byte tokens plus the ChatML specials (vocab 259)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIALS + sorted(alphabet))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(SPECIALS)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tok.chat_template = CHATML
    return tok


def build(target: Path, seed: int = 0, hidden: int = 64, layers: int = 2) -> Path:
    """Write a tiny Llama (hidden 64, 2 layers, ~0.1M params) and its tokenizer to `target`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-", dir=target.parent))
    with no_progress_bars():
        model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    if target.exists():
        shutil.rmtree(tmp)
    else:
        tmp.rename(target)
    return target

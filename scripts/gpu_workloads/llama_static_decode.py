"""A plain inference script: Hugging Face's Llama (random weights, a small config with grouped-query attention)
generating greedily over a static KV cache, `generate(..., cache_implementation="static")`, as its documentation
recommends for fast decoding; on recent transformers, generate() then compiles the decoding step itself
(`torch.compile`, CUDA graphs) unless `--no-compile`. Nothing of Operator Profiler in it.

    operator-profiler run --script scripts/gpu_workloads/llama_static_decode.py --window-fn generate --steps 1:1

Needs transformers. `OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks the model for a CPU run.
"""

from __future__ import annotations

import argparse
import os

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SIZES = {"full": {"hidden": 1024, "layers": 8, "heads": 16, "kv_heads": 4, "vocab": 32000, "batch": 4, "prompt": 64},
         "small": {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "vocab": 1000, "batch": 2, "prompt": 8}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3, help="generate() calls")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--no-compile", action="store_true", help="generate() without compiling its decoding step")
    args = parser.parse_args()
    sizes = SIZES[os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE", "full")]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=sizes["hidden"], intermediate_size=4 * sizes["hidden"],
                         num_hidden_layers=sizes["layers"], num_attention_heads=sizes["heads"],
                         num_key_value_heads=sizes["kv_heads"], vocab_size=sizes["vocab"],
                         max_position_embeddings=sizes["prompt"] + args.new_tokens + 8)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = LlamaForCausalLM(config).to(device, dtype).eval()
    prompts = torch.randint(0, sizes["vocab"], (sizes["batch"], sizes["prompt"]), device=device)
    extra = {"disable_compile": True} if args.no_compile else {}
    with torch.inference_mode():
        for call in range(args.calls):
            tokens = model.generate(prompts, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                    do_sample=False, cache_implementation="static", pad_token_id=0, **extra)
            print(f"call {call}: {tokens.shape[1] - prompts.shape[1]} tokens")


if __name__ == "__main__":
    main()

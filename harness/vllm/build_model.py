"""Build the tiny random-weight Llama that real vLLM engines serve in pdchaos (run by the vLLM venv's Python).

    <vllm venv>/bin/python build_model.py --out DIR --tokenizer FAKE_ENGINES_DATA_DIR [--seed 0]

Standalone on purpose: it runs in the vLLM environment, where pdchaos itself is not installed, and needs
only torch and transformers from there. Nothing is downloaded: the tokenizer is the fake engines' own
byte-level BPE (a prompt has the same token count on a fake and on a real engine), the weights are seeded
noise.

Shape: hidden 128, 4 heads (head size 32: vLLM's CPU attention needs a multiple of 32 for its vector kernels),
2 layers, 2048 positions (a small KV cache). float32 on purpose: with bfloat16 on a CPU that reports AMX,
vLLM 0.32 picks its AMX attention kernel, and the decode's first forward over pulled KV dies with SIGILL on
machines whose kernel has not granted the process AMX tile state.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
SHAPE = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
}


def build(out: Path, tokenizer_dir: Path, seed: int) -> dict[str, object]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    cfg = LlamaConfig(vocab_size=len(vocab), bos_token_id=0, eos_token_id=0, pad_token_id=0,
                      tie_word_embeddings=True, **SHAPE)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).to(torch.float32)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_dir / name, tmp / name)
    info = {"seed": seed, "vocab_size": len(vocab), "dtype": "float32", **SHAPE}
    (tmp / "pdchaos-model.json").write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)  # all or nothing: a half-built folder is never taken for a model
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="model folder to write (replaced if present)")
    ap.add_argument("--tokenizer", type=Path, required=True, help="folder with tokenizer.json and its config")
    ap.add_argument("--seed", type=int, default=0, help="weights seed (default 0)")
    args = ap.parse_args(argv)
    missing = [n for n in TOKENIZER_FILES if not (args.tokenizer / n).is_file()]
    if missing:
        print(f"build_model: {args.tokenizer} lacks {', '.join(missing)}", file=sys.stderr)
        return 2
    print(json.dumps(build(args.out, args.tokenizer, args.seed)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

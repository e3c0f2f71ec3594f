"""Record Hugging Face ``generate()`` over a padded batch under torch.profiler (issue 57's padding).

A tiny Llama built from its config (random weights, never downloaded), batch 4, prompts of 4, 9,
16 and 24 tokens left-padded to 24, greedy decoding of up to ``--new-tokens`` tokens with an EOS
token chosen so that sequences finish at different steps (a dry run picks, for each sequence, a
token it generates, and the EOS is the one that ends the most sequences earliest): the batch keeps
computing the finished sequences' rows until the last one ends, as ``generate`` does.

What the batch computed and what it needed is known here, from the attention mask and the
generated sequences, and written to ``padding.json``: the positions each forward computed
(batch x query length) and the real ones (prompt tokens in the prefill; one per unfinished
sequence per decode step). The trace (``record_shapes=True``) is ``padded-b4.pt.trace.json.gz``.

Usage::

    python tests/data/record/record_padding.py --out tests/data/inference_padding
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

SHAPE = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=1024, max_position_embeddings=512)
PROMPTS = (4, 9, 16, 24)
PAD = 0


def build():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(**SHAPE, attn_implementation="sdpa", pad_token_id=PAD)
    return LlamaForCausalLM(cfg).eval(), cfg


def inputs(cfg):
    """Prompts of PROMPTS tokens, left-padded to the longest (what a tokenizer with
    ``padding_side="left"`` gives a decoder-only model)."""
    import torch

    g = torch.Generator().manual_seed(1)
    width = max(PROMPTS)
    ids = torch.full((len(PROMPTS), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(PROMPTS):
        ids[i, width - n:] = torch.randint(3, cfg.vocab_size, (n,), generator=g)
        mask[i, width - n:] = 1
    return {"input_ids": ids, "attention_mask": mask}


def pick_eos(model, batch: dict, new_tokens: int) -> int:
    """The token that, as EOS, ends the sequences at the most different steps (not at once)."""
    import torch

    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=new_tokens, do_sample=False, pad_token_id=PAD)
    gen = out[:, batch["input_ids"].shape[1]:].tolist()
    best, best_score = None, None
    for tok in {t for row in gen for t in row[1:]}:
        ends = [row.index(tok) if tok in row else new_tokens for row in gen]
        if min(ends) == 0:
            continue
        # most sequences finishing before the last ends, then at the most different steps
        score = (sum(e < max(ends) for e in ends), len(set(ends)), -tok)
        if best_score is None or score > best_score:
            best, best_score = tok, score
    return int(best)


def computed_vs_real(batch: dict, out, eos: int) -> dict:
    """Positions computed and real, per forward (prefill first), from the mask and the output."""
    width = batch["input_ids"].shape[1]
    gen = out[:, width:].tolist()
    steps = len(gen[0])
    b = len(PROMPTS)
    # a sequence is live in decode step s (computing token s+1) until it produced EOS
    done_at = [row.index(eos) if eos in row else steps for row in gen]
    forwards = [{"phase": "prefill", "computed": b * width, "real": int(batch["attention_mask"].sum())}]
    for s in range(1, steps):
        forwards.append({"phase": "decode", "computed": b, "real": sum(1 for d in done_at if d >= s)})
    return {"eos_token": eos, "prompts": list(PROMPTS), "padded_to": width, "new_tokens_per_sequence":
            [min(d + 1, steps) for d in done_at], "forwards": forwards,
            "computed_positions": sum(f["computed"] for f in forwards), "real_positions": sum(f["real"] for f in forwards)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--new-tokens", type=int, default=16)
    a = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    model, cfg = build()
    batch = inputs(cfg)
    eos = pick_eos(model, batch, a.new_tokens)
    kw = dict(max_new_tokens=a.new_tokens, do_sample=False, pad_token_id=PAD, eos_token_id=eos)
    with torch.no_grad():
        for _ in range(2):  # warm-up
            model.generate(**batch, **kw)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
            out = model.generate(**batch, **kw)
    raw = out_dir / "padded-b4.pt.trace.json"
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(str(raw) + ".gz", "wb", compresslevel=9) as dst:
        dst.write(src.read())
    raw.unlink()
    truth = computed_vs_real(batch, out, eos)
    truth["torch"] = torch.__version__
    (out_dir / "padding.json").write_text(json.dumps(truth, indent=1) + "\n")
    print(json.dumps({k: v for k, v in truth.items() if k != "forwards"}))


if __name__ == "__main__":
    main()

"""A real client: a small Llama-style Hugging Face transformers model with its attention routed to
flashattn through transformers' AttentionInterface, checked against the same model on "sdpa".

The model has random weights (no download): 2 layers, hidden 256, 8 query heads and 2 KV heads
(GQA), head_dim 32. One training step (next-token loss, backward) runs three times from the same
weights and tokens: on attn_implementation="fa_torch" (this package) and "sdpa" in the chosen dtype, and on
"sdpa" in fp64 (the reference). The logits must satisfy the anchor rule
    max|flashattn - ref| <= 2 * max|sdpa - ref| + atol,
and every parameter's gradient the same with 3x. With --padded, the second sequence is
left-padded (the varlen path) and only its real tokens are compared.

    python examples/hf_llama.py                        # CPU, fp32
    python examples/hf_llama.py --device cuda --dtype bfloat16 --padded

Prints one JSON object; exits 1 when a check fails.
"""

import argparse
import copy
import json
import sys

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

import flashattn_torch.hf

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def make_config():
    return LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                       num_attention_heads=8, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
                       attention_dropout=0.0, tie_word_embeddings=False,
                       # weights large enough that the softmax is far from uniform (std 0.02 keeps
                       # every score near 0, where any attention looks right)
                       initializer_range=0.08)


def rounding_atol(ref, dtype):
    """The anchor suite's atol: twice the dtype's rounding of (x + 0.3) - 0.3 at ref's magnitudes."""
    r = ref.to(dtype)
    return 2 * (((r + 0.3).to(dtype) - 0.3).to(dtype).double() - r.double()).abs().max().item()


def rule(out, plain, ref, factor, dtype):
    out, plain, ref = out.double().cpu(), plain.double().cpu(), ref.double().cpu()
    err, plain_err = (out - ref).abs().max().item(), (plain - ref).abs().max().item()
    bound = factor * plain_err + rounding_atol(ref, dtype)
    return {"err": err, "sdpa_err": plain_err, "bound": bound, "ok": bool(err <= bound)}


def training_step(model, input_ids, attention_mask, labels):
    """Logits and every parameter's gradient after one forward + backward of the LM loss."""
    model.zero_grad(set_to_none=True)
    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    out.loss.backward()
    return out.logits.detach(), {n: p.grad.detach() for n, p in model.named_parameters()}


def run(device="cpu", dtype=torch.float32, padded=False, seed=0, batch=2, seqlen=96):
    name = flashattn_torch.hf.register()
    torch.manual_seed(seed)
    base = LlamaForCausalLM(make_config())
    input_ids = torch.randint(0, base.config.vocab_size, (batch, seqlen), device=device)
    attention_mask = None
    labels = input_ids.clone()
    if padded:
        attention_mask = torch.ones(batch, seqlen, dtype=torch.long, device=device)
        attention_mask[1, :seqlen // 3] = 0  # left padding, as for generation
        labels[attention_mask == 0] = -100

    results = {}
    for key, attn, dt in (("flashattn", name, dtype), ("sdpa", "sdpa", dtype), ("ref", "sdpa", torch.float64)):
        model = copy.deepcopy(base).to(device=device, dtype=dt)
        model.set_attn_implementation(attn)
        model.train()
        results[key] = training_step(model, input_ids, attention_mask, labels)

    keep = (attention_mask if attention_mask is not None else torch.ones_like(input_ids)).bool()
    logits = {k: v[0][keep] for k, v in results.items()}  # padded positions' logits are not defined
    report = {"device": device, "dtype": str(dtype).split(".")[-1], "padded": padded,
              "torch": torch.__version__, "transformers": transformers.__version__,
              "logits": rule(logits["flashattn"], logits["sdpa"], logits["ref"], 2, dtype)}
    grads = {n: rule(results["flashattn"][1][n], results["sdpa"][1][n], results["ref"][1][n], 3, dtype)
             for n in results["ref"][1]}
    worst = max(grads, key=lambda n: grads[n]["err"] / grads[n]["bound"])
    report["gradients"] = {"parameters": len(grads), "failed": [n for n, g in grads.items() if not g["ok"]],
                           "worst": worst, **grads[worst]}
    report["ok"] = report["logits"]["ok"] and not report["gradients"]["failed"]
    return report


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=list(DTYPES), default=None,
                        help="default: float32 on the CPU, bfloat16 on CUDA")
    parser.add_argument("--padded", action="store_true", help="left-pad the second sequence (varlen path)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    dtype = DTYPES[args.dtype or ("float32" if args.device == "cpu" else "bfloat16")]
    report = run(args.device, dtype, args.padded, args.seed)
    print(json.dumps(report, indent=2))
    sys.exit(0 if report["ok"] else 1)


if __name__ == "__main__":
    main()

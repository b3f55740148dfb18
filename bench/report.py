"""Plot and README table from the side-by-side benchmark's JSON lines.

usage: python3 bench/report.py bench/results/h100.json --png bench/results/h100.png --md bench/results/h100.md
One panel per (pass, head_dim, causal): TFLOP/s against seqlen, one line per implementation,
like the FlashAttention papers' figures. The markdown table holds the same numbers.
"""
import argparse
import json
from collections import defaultdict


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def panels(rows):
    out = defaultdict(lambda: defaultdict(dict))
    for r in rows:
        if r.get("problem"):  # the classic problem and the matmul ceiling: not on the sweep's axes
            continue
        out[(r["pass"], r["head_dim"], r["causal"])][r["impl"]][r["seqlen_q"]] = r["tflops"]
    return out


COLORS = {"flashattn-sm90": "tab:red", "flashattn-sm90+lse": "lightcoral", "flashattn-sm80": "tab:blue",
          "torch-cudnn": "tab:green", "torch-flash": "tab:orange", "torch-efficient": "tab:purple", "torch-math": "tab:gray"}


def plot(rows, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ps = panels(rows)
    keys = sorted(ps, key=lambda k: (k[0] != "fwd", k[1], k[2]))
    cols = 4
    nrows = (len(keys) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.8 * nrows), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        for impl, pts in sorted(ps[key].items()):
            xs = sorted(pts)
            ax.plot(xs, [pts[x] for x in xs], marker="o", label=impl, color=COLORS.get(impl),
                    linewidth=2.5 if impl.startswith("flashattn") else 1.2)
        p, d, causal = key
        ax.set_title(f"{p}, head_dim {d}, {'causal' if causal else 'non-causal'}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("seqlen")
        ax.set_ylabel("TFLOP/s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    device = rows[0]["device"] if rows else ""
    fig.suptitle(f"Attention, bf16, 16k tokens, hidden 2048 — {device}")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def table(rows):
    ps = panels(rows)
    lines = []
    for key in sorted(ps, key=lambda k: (k[0] != "fwd", k[1], k[2])):
        p, d, causal = key
        impls = sorted(ps[key])
        seqlens = sorted({s for pts in ps[key].values() for s in pts})
        lines.append(f"\n**{p}, head_dim {d}, {'causal' if causal else 'non-causal'}** (TFLOP/s)\n")
        lines.append("| impl | " + " | ".join(str(s) for s in seqlens) + " |")
        lines.append("|---|" + "---|" * len(seqlens))
        for impl in impls:
            vals = [f"{ps[key][impl][s]:.0f}" if s in ps[key][impl] else "–" for s in seqlens]
            lines.append(f"| {impl} | " + " | ".join(vals) + " |")
    classic = [r for r in rows if r.get("problem") == "classic"]
    if classic:
        lines.append("\n**classic: batch 32, seqlen 512, 16 heads, head_dim 64, causal, fp16 (forward)**\n")
        lines.append("| impl | ms | TFLOP/s | peak extra memory (MB) |")
        lines.append("|---|---|---|---|")
        for r in classic:
            lines.append(f"| {r['impl']} | {r['ms']:.3f} | {r['tflops']:.0f} | {r.get('peak_extra_mb', 0):.0f} |")
    dec = [r for r in rows if r.get("problem") == "decode"]
    # A table for each head configuration (rows before the GQA set have no heads_kv: as many as heads).
    for heads, heads_kv in sorted({(r["heads"], r.get("heads_kv", r["heads"])) for r in dec}):
        part = [r for r in dec if (r["heads"], r.get("heads_kv", r["heads"])) == (heads, heads_kv)]
        shapes = sorted({(r["batch"], r["seqlen_k"]) for r in part})
        impls = sorted({r["impl"] for r in part})
        gbps = {(r["impl"], r["batch"], r["seqlen_k"]): r["gbps"] for r in part}
        heads_text = f"{heads} heads" if heads == heads_kv else f"{heads} query heads over {heads_kv} kv heads"
        lines.append(f"\n**decode: one query row, {heads_text}, head_dim {part[0]['head_dim']}, "
                     f"{part[0]['dtype']}** (GB/s of K and V read)\n")
        lines.append("| impl | " + " | ".join(f"b{b} {sk // 1024}k" for b, sk in shapes) + " |")
        lines.append("|---|" + "---|" * len(shapes))
        for impl in impls:
            vals = [f"{gbps[(impl, b, sk)]:.0f}" if (impl, b, sk) in gbps else "–" for b, sk in shapes]
            lines.append(f"| {impl} | " + " | ".join(vals) + " |")
    ceil = [r for r in rows if r.get("problem") == "ceiling"]
    if ceil:
        lines.append("\n**the card's ceiling: cuBLAS bf16 matmul 8192^3, before and after the sweep** (TFLOP/s): "
                     + ", ".join(f"{r['tflops']:.0f} ({r['when']})" for r in ceil) + "\n")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("json")
    ap.add_argument("--png")
    ap.add_argument("--md")
    a = ap.parse_args()
    rows = load(a.json)
    if a.png:
        plot(rows, a.png)
    md = table(rows)
    if a.md:
        open(a.md, "w").write(md)
    else:
        print(md)


if __name__ == "__main__":
    main()

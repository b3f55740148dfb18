"""The real client: examples/hf_llama.py (a small Llama on transformers' AttentionInterface) must
match the same model on sdpa within the 2x rule (logits) and 3x rule (every gradient)."""

import importlib.util
from pathlib import Path

import pytest
import torch

from attn_reference import CUDA, NO_CUDA

pytest.importorskip("transformers", reason="transformers is not installed: the Hugging Face client test is SKIPPED "
                                           "(pip install transformers)")

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "hf_llama.py"


def load_example():
    spec = importlib.util.spec_from_file_location("hf_llama", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CASES = [("cpu", torch.float32, False), ("cpu", torch.bfloat16, True),
         ("cuda", torch.bfloat16, False), ("cuda", torch.float16, True)]


@pytest.mark.parametrize("device, dtype, padded", CASES,
                         ids=[f"{d}-{str(t).split('.')[-1]}{'-padded' if p else ''}" for d, t, p in CASES])
def test_llama_matches_sdpa(device, dtype, padded, seeded):
    if device == "cuda" and not CUDA:
        pytest.skip(NO_CUDA)
    report = load_example().run(device, dtype, padded, seed=seeded)
    assert report["logits"]["ok"], f"logits: {report['logits']}"
    assert not report["gradients"]["failed"], f"gradients: {report['gradients']}"

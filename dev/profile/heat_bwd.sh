#!/bin/bash
# sm80 backward at d128 against torch flash, card cold, then after 90 s of cuBLAS products (hot).
set -u
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON -DFLASHATTN_CUDA_HEAD_DIMS="128" > /dev/null && cmake --build build -j 16 --target flashattn > /dev/null 2>&1 || exit 1
smi() { nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv,noheader; }
for state in cold hot; do
  if [ $state = hot ]; then
    python3 -c "
import torch, time
a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16); b = torch.randn_like(a)
t = time.time()
while time.time() - t < 90:
    for _ in range(20): torch.matmul(a, b)
    torch.cuda.synchronize()
"
  fi
  echo "== $state: $(smi)"
  python3 bench/gpu_bench.py --lib build/libflashattn.so --impls flashattn-sm80,torch-flash,torch-cudnn --head-dims 128 --passes bwd --out $OUT/$state.json > /dev/null 2>&1
  echo "   after: $(smi)"
  python3 -c "
import json
rows=[json.loads(l) for l in open('$OUT/$state.json')]
t={(r['impl'],r['causal'],r['seqlen_q']):r['tflops'] for r in rows if not r.get('problem')}
for c in (False, True):
  for s in (4096, 8192, 16384):
    print('  causal', int(c), s, ' '.join('%s %.0f' % (i, t[(i, c, s)]) for i in ('flashattn-sm80', 'torch-flash', 'torch-cudnn')), ' ratio %.2f' % (t[('flashattn-sm80', c, s)] / t[('torch-flash', c, s)]))
print('  ceiling', ' '.join('%.0f' % r['tflops'] for r in rows if r.get('problem') == 'ceiling'))
"
done

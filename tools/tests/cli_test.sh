#!/usr/bin/env bash
# End-to-end tests of the flashattn CLI on the CPU: exit codes and key output lines of run, io
# and bench, bad flags, --help. Usage: cli_test.sh path/to/flashattn work_dir
set -uo pipefail
bin=$1
work=$2
mkdir -p "$work"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# expect CODE NAME -- ARGS...: runs the binary, keeps stdout/stderr in $work/NAME.{out,err}.
expect() {
  local code=$1 name=$2
  shift 3
  "$bin" "$@" >"$work/$name.out" 2>"$work/$name.err"
  local got=$?
  if [ "$got" != "$code" ]; then
    fail "$name: exit code $got, expected $code ($*)"
    sed 's/^/  | /' "$work/$name.out" "$work/$name.err" | tail -20
  fi
}
# has NAME STREAM PATTERN: the output holds a line matching the extended regex.
has() {
  grep -Eq -- "$3" "$work/$1.$2" || { fail "$1: no line matching '$3' in std$2"; sed 's/^/  | /' "$work/$1.$2" | tail -20; }
}

# run: a small problem on the CPU, every implementation ok against the fp64 reference.
expect 0 run_small -- run --device cpu --batch 2 --seqlen 64 --heads 2 --head-dim 16
has run_small out '^problem : batch 2, seqlen_q 64, seqlen_k 64, heads 2 \(kv 2\), head_dim 16, causal, fp32'
for impl in cpu-reference cpu-fa1 cpu-fa2; do has run_small out "^$impl .* ok$"; done
has run_small out '^result: ok$'

# run: the other fields of the params struct reach the library (GQA, window, softcap, scale,
# bhsd layout, bf16, threads, cache budget, non-causal) and the results stay correct.
expect 0 run_features -- run --device cpu --batch 2 --seqlen-q 33 --seqlen-k 50 --heads 4 --heads-kv 2 --head-dim 24 \
  --no-causal --window-left 7 --window-right 3 --softcap 4 --scale 0.3 --layout bhsd --dtype bf16 --threads 1 \
  --cache-bytes 16K --impl standard,fa2
has run_features out 'non-causal, bf16, bhsd'
has run_features out 'window \(7, 3\), softcap 4, scale 0.3'
has run_features out '^cpu-fa2 .* ok$'
has run_features out 'B_r = 24, B_c = 43'
has run_features out '^result: ok$'

# run: forward and backward; the backward table checks dq, dk, dv (GQA sums over the group).
expect 0 run_backward -- run --device cpu --pass both --batch 2 --seqlen-q 40 --seqlen-k 70 --heads 4 --heads-kv 2 \
  --head-dim 32 --softcap 5
has run_backward out '^backward \(dq, dk, dv'
has run_backward out 'max\|dq-ref\|'
has run_backward out '^cpu-fa1 .* skipped: unsupported'
test "$(grep -Ec '^cpu-fa2 .* ok$' "$work/run_backward.out")" = 2 || fail "run_backward: cpu-fa2 not ok in both tables"
has run_backward out '^result: ok$'
expect 2 bad_pass -- run --pass sideways
has bad_pass err -- '--pass'

# run: ALiBi reaches the library and the reference, forward and backward.
expect 0 run_alibi -- run --device cpu --pass both --batch 2 --seqlen-q 30 --seqlen-k 45 --heads 4 --heads-kv 2 \
  --head-dim 16 --alibi --impl fa2
has run_alibi out 'ALiBi'
test "$(grep -Ec '^cpu-fa2 .* ok$' "$work/run_alibi.out")" = 2 || fail "run_alibi: cpu-fa2 not ok in both tables"
has run_alibi out '^result: ok$'

# run: dropout on the CPU FA2 against the fp64 reference with the same mask (both passes).
expect 0 run_dropout -- run --device cpu --pass both --batch 2 --seqlen-q 30 --seqlen-k 45 --heads 4 --heads-kv 2 \
  --head-dim 16 --dropout 0.3 --dropout-seed 5 --impl fa2
has run_dropout out 'dropout 0.3'
test "$(grep -Ec '^cpu-fa2 .* ok$' "$work/run_dropout.out")" = 2 || fail "run_dropout: cpu-fa2 not ok in both tables"
has run_dropout out '^result: ok$'

# run: variable length with an empty sequence.
expect 0 run_varlen -- run --device cpu --varlen 5,0,17 --varlen-k 9,3,17 --heads 2 --head-dim 8 --impl fa2,standard
has run_varlen out 'packed varlen'
has run_varlen out '^cpu-fa2 .* ok$'

# run: the classic problem is scaled down when the fp64 reference would be slow.
expect 0 run_scaled -- run --device cpu --batch 64 --seqlen 256 --heads 4 --head-dim 32 --budget 0.01 --impl fa2 --repeats 1
has run_scaled out '^note: the full problem \(batch 64\) would take'

# bad flags: exit code 2 and a message naming the flag.
expect 2 bad_unknown -- run --bogus-flag 3
has bad_unknown err 'bogus-flag'
expect 2 bad_heads -- run --heads 6 --heads-kv 4
has bad_heads err -- '--heads-kv'
expect 2 bad_dtype -- run --dtype fp8
has bad_dtype err -- '--dtype'
expect 2 bad_number -- run --batch many
has bad_number err -- '--batch'
expect 2 bad_window -- run --window-left -5
has bad_window err -- '--window-left'
expect 2 bad_impl -- run --device cpu --impl fa9
has bad_impl err -- '--impl'
expect 2 bad_device -- run --device tpu
has bad_device err -- '--device'
expect 2 bad_io -- io --cache-bytes 12Q
has bad_io err -- '--cache-bytes'
expect 2 no_command --

# io: the exact counts of the model (N = 512, d = 64, M = 100 KiB = 25600 fp32 elements:
# B_c = 100, B_r = 64, T_r = 8, T_c = 6; standard = 4Nd + 4N^2 = 1179648;
# FA1 = (Nd + 2N) + 2Nd + 48 pairs x 64 rows x (3d + 4) = 701440).
expect 0 io -- io --seqlens 512,1024 --head-dim 64 --cache-bytes 100K
has io out 'B_c = ceil\(M / 4d\) = 100, B_r = min\(B_c, d\) = 64'
has io out '^ +512 +8 +6 +1179648 +701440 '
has io out '^ +1024 +16 +11 '

# bench: forward and backward, JSON lines that parse with the documented fields.
rm -f "$work/bench.json"
expect 0 bench -- bench --device cpu --seqlens 32,64 --head-dims 16 --heads 2 --batch 1 --pass fwd,bwd --repeats 2 \
  --json "$work/bench.json"
has bench out '^cpu-fa2 +fwd +fp32 +1 +2 +32 +32 +16 '
has bench out '^cpu-fa2 +bwd +fp32 +1 +2 +64 +64 +16 '
printf 'seqlen=48 head_dim=8 heads=1 causal=on  # a comment\n\nbatch=2 seqlen_q=10 seqlen_k=20 head_dim=8 heads=2\n' >"$work/shapes.txt"
expect 0 bench_file -- bench --device cpu --file "$work/shapes.txt" --impl fa2,standard --repeats 1 --json "$work/bench.json"
python3 - "$work/bench.json" <<'PY' || fail "bench: the JSON lines are not what they should be"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
need = {"impl", "pass", "dtype", "batch", "heads", "seqlen_q", "seqlen_k", "head_dim", "causal", "ms", "tflops",
        "gflops", "device", "date"}
assert len(rows) == 4 + 4, f"{len(rows)} rows"
for r in rows:
    assert need <= set(r), f"missing {need - set(r)}"
    assert r["ms"] > 0 and r["tflops"] > 0, r
assert sorted((r["pass"], r["seqlen_q"]) for r in rows[:4]) == [("bwd", 32), ("bwd", 64), ("fwd", 32), ("fwd", 64)]
assert {(r["impl"], r["seqlen_q"], r["seqlen_k"], r["causal"]) for r in rows[4:]} == {
    ("cpu-fa2", 48, 48, True), ("cpu-reference", 48, 48, True), ("cpu-fa2", 10, 20, False), ("cpu-reference", 10, 20, False)}
PY
# bench with ALiBi, dropout and softcap: the JSON names them; a bad dropout is a failed row naming dropout_p.
rm -f "$work/bench_extras.json"
expect 0 bench_extras -- bench --device cpu --seqlens 40 --head-dims 16 --heads 2 --batch 1 --pass fwd,bwd --repeats 1 \
  --alibi --dropout 0.2 --dropout-seed 7 --softcap 5 --json "$work/bench_extras.json"
python3 - "$work/bench_extras.json" <<'PY' || fail "bench: ALiBi, dropout, softcap not in the JSON lines"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
assert len(rows) == 2 and all(r["alibi"] and abs(r["dropout"] - 0.2) < 1e-6 and r["softcap"] == 5 and r["ms"] > 0 for r in rows), rows
PY
bench_out=$("$bin" bench --device cpu --seqlens 40 --head-dims 16 --heads 2 --batch 1 --repeats 1 --dropout 1.5 2>&1)
grep -q 'FAILED: invalid argument: dropout_p' <<<"$bench_out" || fail "bench --dropout 1.5: no failed row naming dropout_p"

# --help on each command.
for cmd in run bench io; do
  expect 0 "help_$cmd" -- "$cmd" --help
  has "help_$cmd" out '--'
done
has help_run out -- '--seqlen-q'
has help_run out -- '--deterministic'
has help_bench out -- '--json'
has help_io out -- '--cache-bytes'

if [ "$fails" -ne 0 ]; then
  echo "$fails check(s) failed"
  exit 1
fi
echo "cli tests: all passed"

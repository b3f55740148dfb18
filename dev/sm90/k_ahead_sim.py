#!/usr/bin/env python3
"""Deadlock check of dev/sm90/k_ahead.patch's barrier protocol, on random tile sequences (no GPU).

One producer thread (k of block j before v of block j - 1, across tiles; q double-buffered, polled while it waits
for a stage, then waited for at the tile's end) against the consumers (both warpgroups alike: one program; the
staged epilogue frees a tile's q buffer when the next tile issues its first S; its 16-byte-store path, varlen and
overhanging tiles, frees it at once, which can only help). Loads complete as issued; a run
deadlocks when neither side can move. Without the patch's flush of the pending v at a tile without key blocks
it deadlocks (e.g. tiles of 5, 0, 0, 1 blocks); with it, and in the order without the patch, it does not.
Usage: python3 dev/sm90/k_ahead_sim.py"""
import random, itertools

def run(tiles, KS, VS, k_ahead=True, flush_empty=True):
    """True when both programs finish; tiles: key blocks per tile; KS, VS: the k and v rings' stages."""
    st = dict(k_rel=0, v_rel=0, q_rel=0, k_ld=0, v_ld=0, q_ld=0)   # counts; loads complete when issued
    def k_free(g): return st['k_rel'] >= g - KS + 1
    def v_free(g): return st['v_rel'] >= g - VS + 1
    def q_free(t): return st['q_rel'] >= t - 2 + 1
    starts = list(itertools.accumulate([0] + tiles))
    T = len(tiles)
    def producer():
        st['q_ld'] = 1                           # q of tile 0 (buffers free)
        pend = None; v_next = 0
        for t in range(T):
            q_pending = t + 1 < T
            def wait(cond):
                nonlocal q_pending
                while not cond():
                    if q_pending and q_free(t + 1):
                        st['q_ld'] += 1; q_pending = False
                    yield
            for g in range(starts[t], starts[t + 1]):
                if k_ahead:
                    yield from wait(lambda: k_free(g)); st['k_ld'] += 1
                    if pend is not None:
                        yield from wait(lambda: v_free(pend)); st['v_ld'] += 1
                    pend = g
                else:
                    yield from wait(lambda: k_free(g)); st['k_ld'] += 1
                    yield from wait(lambda: v_free(g)); st['v_ld'] += 1
            if k_ahead and pend is not None and ((tiles[t] == 0 and flush_empty) or t == T - 1):
                yield from wait(lambda: v_free(pend)); st['v_ld'] += 1; pend = None
            if q_pending:
                while not q_free(t + 1): yield
                st['q_ld'] += 1
        if pend is not None:  # main's order never leaves one; the patch flushes it at the last tile
            while not v_free(pend): yield
            st['v_ld'] += 1
    def consumer():
        deferred = False
        for t in range(T):
            while st['q_ld'] < t + 1: yield
            g0, m = starts[t], tiles[t]
            if m == 0:
                if deferred: st['q_rel'] += 1
                deferred = True; continue
            while st['k_ld'] < g0 + 1: yield
            if deferred: st['q_rel'] += 1
            st['k_rel'] += 1
            for j in range(1, m):
                while st['k_ld'] < g0 + j + 1 or st['v_ld'] < g0 + j: yield
                st['k_rel'] += 1
                while st['v_ld'] < g0 + j + 1: yield
                st['v_rel'] += 1
            while st['v_ld'] < g0 + m: yield
            st['v_rel'] += 1
            deferred = True
    ps, cs = producer(), consumer()
    pdone = cdone = False
    for _ in range(100000):
        if not pdone:
            try: next(ps)
            except StopIteration: pdone = True
        if not cdone:
            try: next(cs)
            except StopIteration: cdone = True
        if pdone and cdone: return True
    return False

random.seed(1)
for flush in (False, True):
    bad, example = 0, None
    for trial in range(3000):
        tiles = [random.choice([0, 0, 1, 1, 2, 3, 4, 5]) for _ in range(random.randint(1, 8))]
        for KS, VS in ((3, 2), (4, 3), (2, 2)):
            if not run(tiles, KS, VS, flush_empty=flush):
                bad += 1
                example = example or (tiles, KS, VS)
    print(f"k ahead, flush at empty tiles {flush}: {bad} deadlocks of 9000", example or "")
bad = sum(not run([random.choice([0, 1, 2, 3]) for _ in range(6)], 2, 2, k_ahead=False) for _ in range(2000))
print(f"k and v together (main's order): {bad} deadlocks of 2000")

"""A model of the forward's tile schedules (docs/sm90.md, step 62): the static snake (scheduler.cuh: round r gives
tiles r G .. r G + G - 1 to the G CTAs, reversed in odd rounds) against list scheduling, where each CTA takes the next
tile of an order when it starts its current one (`ahead` tiles taken before their use), the first `static_rounds`
rounds as the snake's. A tile costs its key blocks + 1 (the per-tile code); each tile's time is scattered by +-noise.
Prints the makespan over the mean per CTA, after checking the Python copy of dev/sm90/dynamic_plans.patch's order.
usage: python3 dev/sm90/schedule_model.py"""
import heapq
import random


def section_order(num_bh, heads_per_section, costs):
    """Tile costs in index order: sections of heads, m_block outer, longest first (decode_tile)."""
    out = []
    for first in range(0, num_bh, heads_per_section):
        out += [c for c in costs for _ in range(min(heads_per_section, num_bh - first))]
    return out


def snake(costs, grid, noise=0.0):
    load = [0.0] * grid
    for t, c in enumerate(costs):
        r, i = divmod(t, grid)
        load[grid - 1 - i if r % 2 else i] += c * (1 + random.uniform(-noise, noise))
    return max(load)


def dynamic(costs, grid, ahead=1, static_rounds=1, noise=0.0):
    n = len(costs)
    queues = [[c + k * grid for k in range(static_rounds) if c + k * grid < n] for c in range(grid)]
    nxt = static_rounds * grid
    for c in random.sample(range(grid), grid):
        while len(queues[c]) < ahead and nxt < n:
            queues[c].append(nxt)
            nxt += 1
    heap = [(0.0, c) for c in range(grid)]
    end = 0.0
    while heap:
        now, c = heapq.heappop(heap)
        if not queues[c]:
            end = max(end, now)
            continue
        t = queues[c].pop(0)
        while len(queues[c]) < ahead and nxt < n:
            queues[c].append(nxt)
            nxt += 1
        heapq.heappush(heap, (now + costs[t] * (1 + random.uniform(-noise, noise)), c))
    return end


def dynamic_order(j, n, grid, tail_rounds, heads_per_section, last_heads, m_blocks):
    """scheduler.cuh's dynamic_order in dev/sm90/dynamic_plans.patch: position j to a tile index, the last
    tail_rounds rounds longest first (by m_index, then by index)."""
    tail = min(n, tail_rounds * grid)
    t0, section_tiles = n - tail, heads_per_section * m_blocks
    if j < t0 or j >= n:
        return j
    last, q = (n - 1) // section_tiles, j - t0
    for m_index in range(m_blocks):
        for s in range(t0 // section_tiles, last + 1):
            heads = last_heads if s == last else heads_per_section
            first = s * section_tiles + m_index * heads
            lo, hi = max(first, t0), min(first + heads, n)
            if hi > lo:
                if q < hi - lo:
                    return lo + q
                q -= hi - lo
    return None


def check_dynamic_order():
    """Every tile once, and the tail's m_index non-decreasing, on even and uneven sections."""
    for num_bh, h, m_blocks, tail_rounds in ((1024, 6, 4, 4), (128, 33, 4, 4), (100, 7, 5, 4), (13, 4, 3, 4),
                                             (1000, 6, 4, 2), (1024, 6, 4, 0)):
        n, grid = num_bh * m_blocks, 132
        last_heads = num_bh - (num_bh - 1) // h * h
        order = [dynamic_order(j, n, grid, tail_rounds, h, last_heads, m_blocks) for j in range(n)]
        assert sorted(order) == list(range(n)), (num_bh, h)

        def m_index(t):
            s, r = divmod(t, h * m_blocks)
            return r // (last_heads if s * h + h > num_bh else h)
        tail = [m_index(t) for t in order[n - min(n, tail_rounds * grid):]]
        assert all(a <= b for a, b in zip(tail, tail[1:])), (num_bh, h)
    print("dynamic_order: a bijection, its tail longest first")


def main():
    check_dynamic_order()
    random.seed(1)
    grid, costs = 132, [5, 4, 3, 2]  # causal 512 keys, 128 x 128 tiles: 4, 3, 2, 1 key blocks + 1
    print("(batch, head) pairs, heads a section | makespan / mean: snake (no noise, 10%) | dynamic, 10% noise: "
          "section order (1 or 3 ahead), last 2 / 4 rounds longest first, longest first")
    for num_bh, h in ((1024, 6), (1024, 33), (512, 6), (128, 33), (128, 6)):
        base = section_order(num_bh, h, costs)
        mean = sum(base) / grid
        tail = lambda k: base[:-k] + sorted(base[-k:], reverse=True)  # noqa: E731
        avg = lambda f: sum(f() for _ in range(5)) / 5 / mean  # noqa: E731
        row = [snake(base, grid) / mean, avg(lambda: snake(base, grid, 0.1)),
               avg(lambda: dynamic(base, grid, 1, 1, 0.1)), avg(lambda: dynamic(base, grid, 3, 0, 0.1)),
               avg(lambda: dynamic(tail(2 * grid), grid, 1, 1, 0.1)), avg(lambda: dynamic(tail(4 * grid), grid, 1, 1, 0.1)),
               avg(lambda: dynamic(sorted(base, reverse=True), grid, 1, 1, 0.1))]
        print(f"{num_bh:5d} {h:3d} | " + " ".join(f"{x:.3f}" for x in row))


if __name__ == "__main__":
    main()

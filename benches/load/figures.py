#!/usr/bin/env python3
"""Prints issue 33's figures against their targets from figures.sh's measurements
(stdin: `rps <tag> <req/s> <server µs/req> <Redis µs/req>` lines, `async …`, `lat …`,
`hwm <KiB>`, `workers <list>`)."""
import sys

rps, cpu = {}, {}
lat, asyn, hwm, workers = [], None, 0, []
for line in sys.stdin:
    w = line.split()
    if w[0] == "rps":
        rps[w[1]] = float(w[2])
        cpu[w[1]] = (float(w[3]), float(w[4]))
    elif w[0] == "async":
        asyn = [float(x) for x in w[1:]]
    elif w[0] == "lat":
        lat.append([int(x) for x in w[1:]])
    elif w[0] == "hwm":
        hwm = int(w[1])
    elif w[0] == "workers":
        workers = w[1:]

rows = []


def row(figure, measured, target, met):
    rows.append((figure, measured, target, "met" if met else "**not met**"))


def total(tag):
    return sum(cpu[tag])


print("| measurement | req/s | server µs CPU / req | Redis µs CPU / req |")
print("|---|---|---|---|")
for tag in sorted(rps):
    print(f"| {tag} | {rps[tag]:.0f} | {cpu[tag][0]} | {cpu[tag][1]} |")
print()
for w in workers:
    n = f"{w} worker{'s' if w != '1' else ''} each"
    r = total(f"ig_first{w}") / total(f"peer_first{w}")
    row(f"1. CPU per first delivery, idemgate + Redis / peer + Redis ({n})",
        f"{total(f'ig_first{w}'):.1f} / {total(f'peer_first{w}'):.1f} µs = {r:.2f}", "<= 0.6", r <= 0.6)
    r = total(f"ig_copies{w}") / total(f"peer_copies{w}")
    row(f"2. CPU per copy (0.98 copies) / peer ({n})",
        f"{total(f'ig_copies{w}'):.1f} / {total(f'peer_copies{w}'):.1f} µs = {r:.2f}", "<= 0.6", r <= 0.6)
    r = rps[f"ig_first{w}"] / rps[f"peer_first{w}"]
    row(f"3. first deliveries req/s / peer ({n})",
        f"{rps[f'ig_first{w}']:.0f} / {rps[f'peer_first{w}']:.0f} = {r:.2f}", ">= 1.3", r >= 1.3)
    r = rps[f"ig_copies{w}"] / rps[f"proxy_copies{w}"]
    row(f"4. 0.98 copies req/s / nginx proxy_pass ({n})",
        f"{rps[f'ig_copies{w}']:.0f} / {rps[f'proxy_copies{w}']:.0f} = {r:.2f}", ">= 1.0", r >= 1.0)
if "1" in workers and "2" in workers:
    one, two = cpu["ig_first1"][0], cpu["ig_first2"][0]
    r = two / one - 1
    row("5. two runtimes: idemgate CPU per first delivery over one",
        f"{two} vs {one} µs = {r:+.0%}", "<= +10%", r <= 0.10)
if lat:
    p50 = [(i50 - d50) / 1000 for d50, _, i50, _, _ in lat]
    p99 = [(i99 - d99) / 1000 for _, d99, _, i99, _ in lat]
    bad = sum(x[4] for x in lat)
    row("6. added latency over direct at the fixed rate, p50 (each run)",
        ", ".join(f"{x:.3f}" for x in p50) + " ms", "<= 0.35 ms", max(p50) <= 0.35 and bad == 0)
    row("6. … p99 (each run)", ", ".join(f"{x:.3f}" for x in p99) + " ms", "<= 1.0 ms",
        max(p99) <= 1.0 and bad == 0)
if asyn and "ig_first1" in cpu:
    a = asyn[0] + asyn[1]
    s = total("ig_first1")
    row("7. async: CPU per delivered delivery vs sync (one worker)",
        f"{a:.1f} vs {s:.1f} µs ({a - s:+.1f})", "<= sync + 15 µs", a <= s + 15)
    row("7. async acknowledgement p99 at the fixed rate",
        f"{asyn[3] / 1000:.3f} ms (p50 {asyn[2] / 1000:.3f}, non-2xx {asyn[4]:.0f})", "<= 1.5 ms",
        asyn[3] <= 1500 and asyn[4] == 0)
row("8. peak RSS under load", f"{hwm / 1024:.1f} MiB", "<= 32 MiB", hwm <= 32 * 1024)
print("| figure | measured | target | |")
print("|---|---|---|---|")
for r in rows:
    print("| " + " | ".join(r) + " |")

#!/usr/bin/env python3
"""Writes the example load traces for `flotilla sim` (deterministic: no randomness, no clock).

A unit in examples/policies/*.toml is 1 CPU and 4 GiB; demand here is given in units' worth:
CPU-bound (each unit's worth is 1000 millicores and 3 GiB).

    python3 examples/traces/generate.py   # rewrites diurnal.csv, bursty.csv, step.csv beside it
    python3 examples/traces/generate.py --week /tmp/week.csv   # the benchmark's 7-day trace
"""
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
GIB = 1 << 30


def write(name, rows, comment):
    with open(os.path.join(HERE, name), "w") as f:
        f.write(f"# {comment}\n")
        f.write("time_s,cpu_millis,memory_bytes\n")
        for t, units in rows:
            f.write(f"{t},{round(units * 1000)},{round(units * 3 * GIB)}\n")


def diurnal():
    """A day in 5-minute rows: 6 units' worth at 04:00, 40 at 16:00, a smooth cosine between."""
    rows = []
    for t in range(0, 86400 + 1, 300):
        phase = 2 * math.pi * (t / 86400 - 16 / 24)
        rows.append((t, round(23 + 17 * math.cos(phase), 2)))
    return rows


def bursty():
    """An hour in 10-second rows: 5 units' worth, with bursts of 10-30 more lasting 1-5 minutes."""
    bursts = [(300, 120, 20), (900, 60, 30), (1260, 300, 15), (2100, 90, 25), (2400, 180, 10), (3000, 240, 30)]
    rows = []
    for t in range(0, 3600 + 1, 10):
        extra = sum(h for start, length, h in bursts if start <= t < start + length)
        rows.append((t, 5 + extra))
    return rows


def step():
    """Two hours: 5 units' worth, 30 from 0:30 to 1:30, then 5 again."""
    return [(0, 5), (1800, 30), (5400, 5), (7200, 5)]


def week():
    """Seven days in 10-second rows: the diurnal curve, quieter at the weekend, with a fast
    deterministic wiggle (±3 units' worth) so that the policies have something to chase."""
    rows = []
    for t in range(0, 7 * 86400 + 1, 10):
        day = t // 86400
        phase = 2 * math.pi * (t / 86400 - 16 / 24)
        base = 23 + 17 * math.cos(phase)
        if day >= 5:
            base *= 0.5
        wiggle = 3 * math.sin(t / 97.0) * math.sin(t / 1301.0)
        rows.append((t, round(max(0.0, base + wiggle), 2)))
    return rows


if __name__ == "__main__" and sys.argv[1:2] == ["--week"]:
    with open(sys.argv[2], "w") as f:
        f.write("time_s,cpu_millis,memory_bytes\n")
        for t, units in week():
            f.write(f"{t},{round(units * 1000)},{round(units * 3 * GIB)}\n")
elif __name__ == "__main__":
    write("diurnal.csv", diurnal(), "A day of diurnal load: 6 units' worth at 04:00 to 40 at 16:00 (generate.py).")
    write("bursty.csv", bursty(), "An hour of bursts over a base of 5 units' worth (generate.py).")
    write("step.csv", step(), "A step from 5 to 30 units' worth for an hour, then back (generate.py).")

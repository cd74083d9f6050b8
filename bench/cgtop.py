#!/usr/bin/env python3
"""Top functions of a callgrind dump, self and inclusive, per event.

callgrind_annotate 3.19 misreads dumps taken after `callgrind_control -z` (a call made
before the zeroing has `calls=0` and its whole inclusive cost lands on `clone`), so
this reads the format itself.

    python3 bench/cgtop.py FILE [--events N] [--top 40] [--grep REGEX] [--callees REGEX]
"""
import argparse
import re
import sys
from collections import defaultdict


def parse(path):
    names = {}  # compressed-name tables, one namespace for fn/cfn
    self_cost = defaultdict(int)
    incl_calls = defaultdict(int)  # caller -> sum of inclusive cost of its calls (not self-recursive)
    callees = defaultdict(lambda: defaultdict(int))
    total = 0
    fn = None
    cfn = None
    pending_call = False

    def name(v):
        m = re.match(r"\((\d+)\)(?: (.*))?$", v)
        if not m:
            return v
        if m.group(2) is not None:
            names[m.group(1)] = m.group(2)
        return names.get(m.group(1), v)

    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            c = line[0]
            if c.isdigit() or c in "+-*":
                parts = line.split()
                if len(parts) < 2:
                    continue
                cost = int(parts[1])
                if pending_call:
                    pending_call = False
                    if cfn != fn:
                        incl_calls[fn] += cost
                    callees[fn][cfn] += cost
                else:
                    self_cost[fn] += cost
                    total += cost
                continue
            if line.startswith("fn="):
                fn = name(line[3:])
            elif line.startswith("cfn="):
                cfn = name(line[4:])
            elif line.startswith("calls="):
                pending_call = True
    incl = {f: self_cost.get(f, 0) + incl_calls.get(f, 0) for f in set(self_cost) | set(incl_calls)}
    return total, self_cost, incl, callees


def short(n, width=150):
    n = re.sub(r"::h[0-9a-f]{16}$", "", n)
    return n if len(n) <= width else n[: width - 3] + "..."


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--events", type=int, default=1)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--grep")
    ap.add_argument("--callees", help="print the callees of functions matching REGEX")
    ap.add_argument("--callers", help="print the callers of functions matching REGEX")
    ap.add_argument("--inclusive", action="store_true")
    a = ap.parse_args()
    total, self_cost, incl, callees = parse(a.file)
    n = a.events
    print(f"total {total:,} Ir = {total / n:,.0f} Ir/event over {n} events")
    if a.callers:
        for g in sorted((g for g in incl if re.search(a.callers, g)), key=lambda g: -incl[g])[:3]:
            print(f"\n{incl[g] / n:10,.0f} incl {self_cost.get(g, 0) / n:8,.0f} self  {short(g)}")
            rows = [(f, cs[g]) for f, cs in callees.items() if g in cs]
            for f, cost in sorted(rows, key=lambda kv: -kv[1])[: a.top]:
                print(f"    {cost / n:10,.0f}  {short(f, 140)}")
        return
    if a.callees:
        for f in sorted((f for f in incl if re.search(a.callees, f)), key=lambda f: -incl[f])[:5]:
            print(f"\n{incl[f] / n:10,.0f} incl {self_cost.get(f, 0) / n:8,.0f} self  {short(f)}")
            for g, cost in sorted(callees[f].items(), key=lambda kv: -kv[1])[: a.top]:
                print(f"    {cost / n:10,.0f}  {short(g, 140)}")
        return
    table = incl if a.inclusive else self_cost
    rows = sorted(table.items(), key=lambda kv: -kv[1])
    if a.grep:
        rows = [r for r in rows if re.search(a.grep, r[0])]
    for f, cost in rows[: a.top]:
        print(f"{cost / n:10,.0f} {100 * cost / total:5.1f}%  {short(f)}")


if __name__ == "__main__":
    main()

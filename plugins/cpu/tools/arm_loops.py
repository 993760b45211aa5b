#!/usr/bin/env python3
"""Instruction counts of the aarch64 kernels' inner loops, from the disassembly (plugins/cpu/ARM.md).

Usage: arm_loops.py BINARY [SYMBOL_SUBSTRING ...]
Disassembles each matching function with aarch64-linux-gnu-objdump, finds its innermost loops (a backward
branch and its target, with no other loop inside) and prints, per loop: instructions, loads and the bytes they
read, and the counts of the instructions that identify the kernel and its row count (sdot, smmla, smull/smlal,
fmla, fmul/fadd); for loops with FMLA, their density (FMLA per instruction, loads and bytes per FMLA).
"""
import re
import subprocess
import sys

KEYS = ["sdot", "smmla", "smull", "smull2", "smlal2", "sadalp", "saddlp", "fmla", "fmul", "fadd",
        "scvtf", "ushll", "ushll2", "shll", "shll2", "fcvtl", "fcvtl2", "sxtl", "addp"]


def load_bytes(mnemonic, operands):
    """Bytes a load instruction reads (0 for other instructions)."""
    if not (mnemonic.startswith("ld") or mnemonic in ("ldr", "ldp", "ldur")):
        return 0
    regs = re.findall(r"\b([qdsxwbh])\d+\b", operands.split("[")[0])
    vec = re.findall(r"v\d+\.(\d+)([bhsd])", operands.split("[")[0])
    size = {"q": 16, "d": 8, "s": 4, "x": 8, "w": 4, "h": 2, "b": 1}
    if vec:
        lane = {"b": 1, "h": 2, "s": 4, "d": 8}
        return sum(int(n) * lane[t] for n, t in vec)
    return sum(size[r] for r in regs)


def functions(binary, wanted):
    syms = subprocess.run(["aarch64-linux-gnu-nm", "-C", "-S", "--defined-only", binary],
                          capture_output=True, text=True, check=True).stdout
    for line in syms.splitlines():
        parts = line.split(None, 3)
        if len(parts) == 4 and parts[2] in "tT" and any(w in parts[3] for w in wanted):
            yield parts[3], int(parts[0], 16), int(parts[1], 16)


def disassemble(binary, start, size):
    out = subprocess.run(["aarch64-linux-gnu-objdump", "-d", "--no-show-raw-insn",
                          f"--start-address={start}", f"--stop-address={start + size}", binary],
                         capture_output=True, text=True, check=True).stdout
    insns = []
    for line in out.splitlines():
        m = re.match(r"\s*([0-9a-f]+):\s+(\S+)\s*(.*)", line)
        if m:
            insns.append((int(m.group(1), 16), m.group(2), m.group(3)))
    return insns


def loops(insns):
    found = []
    for addr, mnem, ops in insns:
        if mnem.startswith("b") or mnem.startswith("cb") or mnem.startswith("tb"):
            t = re.search(r"\b([0-9a-f]+) <", ops)
            if t and int(t.group(1), 16) <= addr:
                found.append((int(t.group(1), 16), addr))
    inner = [l for l in found if not any(o != l and l[0] <= o[0] and o[1] <= l[1] for o in found)]
    for lo, hi in inner:
        body = [(m, o) for a, m, o in insns if lo <= a <= hi]
        counts = {k: sum(1 for m, _ in body if m == k) for k in KEYS}
        loads = [(m, o) for m, o in body if load_bytes(m, o)]
        yield lo, len(body), len(loads), sum(load_bytes(m, o) for m, o in loads), counts


def main():
    binary, wanted = sys.argv[1], sys.argv[2:] or ["linear_arm::", "activations_arm::", "dot_rows"]
    for name, start, size in functions(binary, wanted):
        print(f"{name} @ {start:#x} ({size} bytes)")
        for lo, n, nloads, nbytes, counts in loops(disassemble(binary, start, size)):
            keys = " ".join(f"{k}={v}" for k, v in counts.items() if v)
            dense = ""
            if counts["fmla"]:
                f = counts["fmla"]
                dense = f"  [{f / n:.2f} fmla/insn, {nloads / f:.3f} loads/fmla, {nbytes / f:.2f} B/fmla]"
            print(f"  loop @ {lo:#x}: {n} insns, {nloads} loads ({nbytes} B)  {keys}{dense}")


main()

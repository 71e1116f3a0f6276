"""Bytes per entry of the sparse wire, index_code fixed against compact
(docs/results/wire.md, decision 0056), per method, from `igrad plan`'s
exact plan (nothing is trained): entries per step are the difference of
the F32 and BF16 payloads over 2 (the index bytes do not depend on the
value type), bytes per entry each code's F32 payload over them. With
--values: bytes per entry under the compact index code for F32, BF16 and FP8
(E4M3 with a 4-byte scale per block) values instead.

    build/igrad model init --size small --out runs/wire/small
    build/igrad model init --size tiny --out runs/wire/tiny
    python3 experiments/wire/run.py build/igrad runs/wire/small runs/wire/tiny
    python3 experiments/wire/run.py --values build/igrad runs/wire/small runs/wire/tiny
"""
import json
import subprocess
import sys

METHODS = ["topk_sync", "adtopk_sync", "iad", "ig"]


def payload(igrad, model, code, value_dtype):
    """Mean payload per rank per step over the release cycle, per method
    (the engine's flat plan at P = 2; ig at its default target 0.25)."""
    out = subprocess.run([igrad, "plan", "--config", model, "--ranks", "2",
                          "--method", ",".join(METHODS), "--density", "0.01", "--target-ratio", "0.25",
                          "--index-code", code, "--value-dtype", value_dtype, "--json"],
                         check=True, capture_output=True, text=True).stdout
    return {r["method"]: r["payload_nbytes"]["mean"] for r in json.loads(out)["rows"]
            if r.get("route") == "flat" and not r.get("projected")}


def main(igrad, models):
    print("| model | method | entries/step | fixed B/entry | compact B/entry "
          "| index bits/entry fixed → compact | payload compact / fixed |")
    print("|---|---|---|---|---|---|---|")
    for m in models:
        f32 = {c: payload(igrad, m, c, "f32") for c in ("fixed", "compact")}
        b16 = payload(igrad, m, "fixed", "bf16")
        for me in METHODS:
            ent = (f32["fixed"][me] - b16[me]) / 2
            bf, bc = f32["fixed"][me] / ent, f32["compact"][me] / ent
            print("| %s | %s | %.0f | %.3f | %.3f | %.2f → %.2f | %.3f |" % (
                m.rstrip("/").split("/")[-1], me, ent, bf, bc, 8 * (bf - 4), 8 * (bc - 4),
                bc / bf))


def values(igrad, models):
    print("| model | method | entries/step | F32 B/entry | BF16 B/entry | FP8 B/entry "
          "| payload BF16 / F32 | payload FP8 / F32 |")
    print("|---|---|---|---|---|---|---|---|")
    for m in models:
        p = {v: payload(igrad, m, "compact", v) for v in ("f32", "bf16", "fp8")}
        for me in METHODS:
            ent = (p["f32"][me] - p["bf16"][me]) / 2
            print("| %s | %s | %.0f | %.3f | %.3f | %.3f | %.3f | %.3f |" % (
                m.rstrip("/").split("/")[-1], me, ent, p["f32"][me] / ent, p["bf16"][me] / ent,
                p["fp8"][me] / ent, p["bf16"][me] / p["f32"][me], p["fp8"][me] / p["f32"][me]))


if __name__ == "__main__":
    if sys.argv[1] == "--values":
        values(sys.argv[2], sys.argv[3:])
    else:
        main(sys.argv[1], sys.argv[2:])

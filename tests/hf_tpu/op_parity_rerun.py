"""Rerun the failing pairs of some ops of a whole-database parity journal on the current code, keeping every other
line, so a fix's effect on the whole-database figures is measured without rerunning all 3,000 pairs:

    PYTHONPATH=$PWD nice -n 10 python -m tests.hf_tpu.op_parity_rerun [--compiled] OUT.jsonl SRC.jsonl OP [OP ...]
        -> OUT.jsonl (SRC's lines, the named ops' failing pairs rerun) and OUT.md (the report)
(OP: an OpInfo name, its variants included; `--failing` instead of names reruns every failing pair of SRC)

The result is a composite (passing pairs were measured on the code SRC ran on); a floor is set only from a
single-code run."""

from __future__ import annotations

import argparse
import json
import pathlib

from tests.hf_tpu import op_parity as P


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("src")
    ap.add_argument("ops", nargs="*", help="OpInfo op names (their variants included)")
    ap.add_argument("--compiled", action="store_true", help="a torch.compile(backend='tpu') journal")
    ap.add_argument("--failing", action="store_true", help="rerun every failing pair of SRC")
    a = ap.parse_args(argv)
    import hf_tpu

    hf_tpu.set_matmul_precision("highest")
    touched = set(a.ops)
    out = pathlib.Path(a.out)
    keep = []
    rows = [(line, json.loads(line)) for line in pathlib.Path(a.src).read_text().splitlines()]
    rows = [(line, r) for line, r in rows if "forward" in r]
    names = {P.pair_name(o): o.name for o in P.ops(1)}
    if a.failing:  # a pair name with a variant (addmm.decomposed) reruns its base op's failing pairs
        touched |= {names.get(r["op"], r["op"]) for _, r in rows
                    if not (r["forward"] == "pass" and r["backward"] in (None, "pass"))}
    for line, r in rows:
        passed = r["forward"] == "pass" and r["backward"] in (None, "pass")
        if names.get(r["op"], r["op"]) in touched and not passed:
            continue  # rerun below
        keep.append(line + "\n")
    out.write_text("".join(keep))
    P.sweep([o for o in P.ops(1) if o.name in touched], 2, compiled=a.compiled, journal=P.Journal(out))
    t = P.Journal(out).tally()
    out.with_suffix(".md").write_text(P.markdown(
        t, f"OpInfo parity on tpu ({'compiled' if a.compiled else 'eager'}, every 1 op, 2 samples): "
           f"{pathlib.Path(a.src).name} with the failing pairs "
           f"of {len(touched)} ops rerun on the current code"))
    print(t.total("forward"), t.total("backward"))


if __name__ == "__main__":
    main()

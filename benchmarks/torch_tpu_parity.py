"""torch_tpu 0.2.0 parity: which of its public names hf-tpu's `torch.tpu` provides, and the behaviour checks.

    python benchmarks/torch_tpu_parity.py [--wheel-dir /tmp/torch_tpu_wheel] [--no-checks]

Reads `_PUBLIC_MODULES` from the wheel's torch_tpu/_internal/public_api.py (parsed, never imported: the
wheel is not installed), downloads the wheel with pip if it is not in --wheel-dir, and compares every
module's exports with what `import torch` gives here. Then runs tests/hf_tpu/test_tpu_api.py (one test
per behaviour) and prints each result."""

from __future__ import annotations

import argparse
import ast
import glob
import os
import subprocess
import sys
import zipfile
from pathlib import Path

VERSION = "0.2.0"
ROOT = Path(__file__).resolve().parent.parent


def wheel_table(wheel_dir: str) -> dict[str, list[str]]:
    """{public module: [exported names]} from the wheel's declarative table."""
    wheels = glob.glob(os.path.join(wheel_dir, f"torch_tpu-{VERSION}-*.whl"))
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", f"torch-tpu=={VERSION}", "--no-deps", "-d",
                        wheel_dir], check=True)
        wheels = glob.glob(os.path.join(wheel_dir, f"torch_tpu-{VERSION}-*.whl"))
    with zipfile.ZipFile(wheels[0]) as z:
        source = z.read("torch_tpu/_internal/public_api.py").decode()
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "_PUBLIC_MODULES":
            table = {}
            for key, spec in zip(node.value.keys, node.value.values):
                exports = next(kw.value for kw in spec.keywords if kw.arg == "exports")
                table[key.value] = [k.value for k in exports.keys]
            return table
    raise RuntimeError("no _PUBLIC_MODULES table in the wheel's public_api.py")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wheel-dir", default="/tmp/torch_tpu_wheel")
    ap.add_argument("--no-checks", action="store_true", help="names only, no behaviour checks")
    args = ap.parse_args()

    import torch

    from hf_tpu.tpu_api.table import TABLE

    theirs = wheel_table(args.wheel_dir)
    total = provided = hardware = 0
    missing: list[str] = []
    for module, names in sorted(theirs.items()):
        mod = sys.modules.get(module)
        ours = TABLE.get(module, {})
        for name in names:
            total += 1
            exp = ours.get(name)
            present = mod is not None and name in dir(mod)
            if exp is not None and exp.hardware_only and present:
                hardware += 1
            elif exp is not None and present:
                provided += 1
            else:
                missing.append(f"{module}.{name}")
    extra = [f"{m}.{n}" for m, names in TABLE.items() for n in names if n not in theirs.get(m, [])]
    print(f"torch_tpu {VERSION}: {total} public names in {len(theirs)} modules ({', '.join(sorted(theirs))})")
    print(f"hf-tpu (torch {torch.__version__}): {provided} implemented, {hardware} present and raising "
          f"TpuHardwareRequired (need TPU chips), {len(missing)} missing")
    print(f"not tied to TPU hardware: {provided} of {total - hardware} provided")
    if missing:
        print("missing:", ", ".join(missing))
    if extra:
        print("in hf-tpu's table but not torch_tpu's:", ", ".join(extra))
    if args.no_checks:
        return 1 if missing else 0
    print("\nbehaviour checks (tests/hf_tpu/test_tpu_api.py):")
    r = subprocess.run([sys.executable, "-m", "pytest", str(ROOT / "tests/hf_tpu/test_tpu_api.py"), "-q", "-rA",
                        "-p", "no:cacheprovider"], capture_output=True, text=True, cwd=ROOT)
    for line in r.stdout.splitlines():
        if line.startswith(("PASSED", "FAILED", "ERROR")):
            print("  " + line)
    print(r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-2000:])
    return 1 if missing or r.returncode else 0


if __name__ == "__main__":
    sys.exit(main())

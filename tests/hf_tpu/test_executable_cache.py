"""The executable cache (hf_tpu/executable_cache.py): a process whose eager ops another process already ran
loads their executables instead of tracing and lowering them, and never gets a program made for something
else. Each case runs fresh processes (executable_cache_child.py) over its own cache directory; CPU PyTorch is
the oracle."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = Path(__file__).with_name("executable_cache_child.py")
TOL = 1e-4  # precision "highest": float32 throughout


def run(cache: Path, **env: str) -> dict:
    full = {**os.environ, "HF_TPU_CACHE_DIR": str(cache), "HF_TPU_EXECUTABLE_CACHE": "1",
            "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])}
    full.pop("HF_TPU_DISABLE_DISK_CACHE", None)
    full.update(env)
    r = subprocess.run([sys.executable, str(CHILD)], capture_output=True, text=True, env=full, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def entries(cache: Path) -> list[Path]:
    return sorted((cache / "executables").glob("*/*.exe"))


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A cache filled by one process, and that process's report."""
    cache = tmp_path_factory.mktemp("exe") / "cache"
    cold = run(cache)
    assert cold["err"] < TOL
    assert cold["traces"] > 0 and cold["stats"]["hits"] == 0
    assert cold["stats"]["saved"] == cold["stats"]["misses"] > 0 == cold["stats"]["corrupt"]
    assert len(entries(cache)) == cold["stats"]["saved"]
    return cache, cold


def copy(warm: tuple[Path, dict], tmp_path: Path) -> Path:
    shutil.copytree(warm[0], tmp_path / "cache")
    return tmp_path / "cache"


def test_second_process_traces_and_compiles_nothing(warm: tuple[Path, dict], tmp_path: Path) -> None:
    cache, cold = warm
    again = run(copy(warm, tmp_path))
    assert again["traces"] == 0, again  # no op program traced (nor lowered)
    # the compiles left are JAX's own eager conversions (jit(convert_element_type): not op programs, and
    # not in JAX's cache here, whose entries do not survive the directory's copy): none of the op programs
    assert again["compiles"] <= cold["compiles"] - cold["traces"], again
    assert again["stats"]["hits"] == cold["stats"]["saved"] and again["stats"]["misses"] == 0
    assert again["bits"] == cold["bits"] and again["err"] < TOL  # the same programs, bit for bit


def test_changed_precision_does_not_reuse(warm: tuple[Path, dict], tmp_path: Path) -> None:
    cache = copy(warm, tmp_path)
    high = run(cache, CHILD_PRECISION="high")
    assert high["stats"]["hits"] == 0 and high["traces"] > 0
    assert high["err"] > 1e-6  # bfloat16-rounded matmul operands: another program, and it shows
    highest = run(cache)  # and the other way round: "highest" still gets its own
    assert highest["bits"] == warm[1]["bits"] and highest["traces"] == 0


def test_changed_xla_flag_does_not_reuse(warm: tuple[Path, dict], tmp_path: Path) -> None:
    flags = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_enable_fast_math=false").strip()
    other = run(copy(warm, tmp_path), XLA_FLAGS=flags)
    assert other["stats"]["hits"] == 0 and other["traces"] > 0 and other["err"] < TOL


def test_corrupt_entries_are_skipped_with_a_warning(warm: tuple[Path, dict], tmp_path: Path) -> None:
    import hashlib

    cache = copy(warm, tmp_path)
    files = entries(cache)
    assert len(files) >= 3
    files[0].write_bytes(files[0].read_bytes()[: len(files[0].read_bytes()) // 2])  # truncated
    data = bytearray(files[1].read_bytes())
    data[-10] ^= 0xFF  # one flipped bit: checksum mismatch
    files[1].write_bytes(bytes(data))
    # a well-formed entry (magic, checksum) whose payload is not an executable
    from hf_tpu import executable_cache

    junk = b"not a pickle"
    files[2].write_bytes(executable_cache.MAGIC + hashlib.sha256(junk).digest() + junk)
    r = run(cache)
    # the three programs are then traced and lowered, and served by their lowered key (the copied cache's
    # lowered entries are files of their own) or compiled
    assert r["stats"]["corrupt"] == 3 and r["stats"]["misses"] + r["stats"]["lowered_hits"] == 3, r
    assert r["err"] < TOL and r["bits"] == warm[1]["bits"]
    assert len(r["warnings"]) == 3 and all("compiling instead" in w for w in r["warnings"])
    again = run(cache)  # the three were saved again
    assert again["stats"]["corrupt"] == 0 and again["traces"] == 0


def test_replaced_lowering_is_never_served_from_the_cache(warm: tuple[Path, dict], tmp_path: Path) -> None:
    faulty = run(copy(warm, tmp_path), CHILD_INJECT="1")
    assert faulty["err"] > 0.1  # the fault shows: gelu's program was traced from the replaced lowering
    assert faulty["stats"]["saved"] == 0  # and nothing traced under a replaced lowering is shared


def test_another_hf_tpu_is_served_by_the_lowered_programs(warm: tuple[Path, dict], tmp_path: Path) -> None:
    """Any commit to hf_tpu changes every ident key (the digest of the sources): a second process of another
    hf_tpu compiled every program again. Now each program, traced and lowered as before, is served by its
    lowered key (no XLA compile), and named by the new ident key too: a third process traces nothing. The new
    names are hard links, not copies."""
    cache, cold = warm
    cache = copy(warm, tmp_path)
    other = run(cache, CHILD_SOURCES="another commit")
    n = cold["stats"]["saved"]
    assert other["stats"]["hits"] == 0 and other["traces"] == cold["traces"], other  # every ident key missed
    assert other["stats"]["lowered_hits"] == n and other["stats"]["misses"] == 0, other
    assert other["compiles"] <= cold["compiles"] - cold["traces"], other  # no op program compiled
    assert other["bits"] == cold["bits"] and other["err"] < TOL
    files = entries(cache)
    assert len(files) == 2 * n  # the old ident keys and the new ones
    new = [f for f in files if f.stat().st_nlink > 1]
    assert len(new) == n
    lowered = sorted((cache / "executables" / "lowered").glob("*/*.exe"))
    assert len(lowered) == n and {f.stat().st_ino for f in new} == {f.stat().st_ino for f in lowered}
    third = run(cache, CHILD_SOURCES="another commit")
    assert third["traces"] == 0 and third["stats"]["hits"] == n and third["bits"] == cold["bits"], third


def test_a_changed_lowering_is_compiled_not_served(warm: tuple[Path, dict], tmp_path: Path) -> None:
    """A commit that changes one lowering (gelu's, in the package's own table: the ident is unchanged) changes
    that program's lowered key: it is compiled, and runs the new lowering (the fault shows against CPU); the
    programs it left alone are served by their lowered keys."""
    cold = warm[1]
    changed = run(copy(warm, tmp_path), CHILD_SOURCES="another commit", CHILD_CHANGE_GELU="1")
    assert changed["err"] > 0.1, changed  # gelu's new program ran, not the saved one
    stats = changed["stats"]
    assert stats["hits"] == 0 and stats["misses"] >= 1 and stats["lowered_hits"] >= 1, changed
    assert stats["misses"] + stats["lowered_hits"] == cold["stats"]["saved"], changed


def test_graph_cache_hit_traces_no_graph_program(tmp_path: Path) -> None:
    """A compiled graph loaded from the graph cache was traced and lowered again in every process. With its
    program named by graph_ident (the same for the graph Dynamo made and for the graph loaded from the cache,
    also with views at storage offsets, which a loaded graph does not keep), the second process traces
    neither the forward nor the backward graph's program, and a third neither."""
    env = {"CHILD_KIND": "graph", "HF_TPU_COMPILE_CACHE": "1", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "torch")}
    cold = run(tmp_path / "cache", **env)
    assert cold["traces"] == 2 and cold["graph_cache"]["saved"] == 1 and cold["err"] < TOL, cold
    assert cold["stats"]["unsaveable"] == 0, cold
    for _ in range(2):
        warm = run(tmp_path / "cache", **env)
        assert warm["graph_cache"]["host"]["hits"] == 1, warm  # the graph cache hit, as before
        assert warm["traces"] == 0 and warm["stats"]["misses"] == 0, warm  # and nothing lowered again
        assert warm["programs"] == cold["programs"] == 2  # the compile count still counts the programs
        assert warm["bits"] == cold["bits"]


def test_graph_from_the_graph_cache_is_served_by_its_lowered_key_after_a_commit(tmp_path: Path) -> None:
    """The nightly's case: yesterday's graph cache and executables, today's hf_tpu. The graph comes from the
    graph cache, its ident key misses (another digest of the sources), and its lowered program must be the
    one the process that traced it saved. A graph with a tensor constant lowered to another module when
    loaded (the constant on CPU, converted inside the trace: a literal where Dynamo's tpu constant was a
    constant of the program), so it was compiled again."""
    env = {"CHILD_KIND": "graph", "CHILD_MODEL": "const", "HF_TPU_COMPILE_CACHE": "1",
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "torch")}
    cold = run(tmp_path / "cache", **env)
    assert cold["traces"] == 2 and cold["graph_cache"]["saved"] == 1 and cold["err"] < TOL, cold
    assert cold["stats"]["unsaveable"] == 0, cold
    other = run(tmp_path / "cache", CHILD_SOURCES="another commit", **env)
    assert other["graph_cache"]["host"]["hits"] == 1, other  # the loaded graph
    assert other["traces"] == 2 and other["stats"]["hits"] == 0, other  # traced and lowered again
    assert other["stats"]["misses"] == 0 and other["stats"]["lowered_hits"] == cold["stats"]["saved"], other
    assert other["bits"] == cold["bits"] and other["err"] < TOL


def test_as_strided_graphs_are_shared_and_told_apart_by_storage_offset(tmp_path: Path) -> None:
    """Graphs with as_strided through views (Longformer's chunking) were never named: traced and lowered in every
    process. Named with what their lowering reads beyond the arguments (the storage's node and its offset),
    the second process traces neither the forward nor the backward graph's program. Two graphs alike but for
    the storage offset of the value as_strided reads (2 and 0) get two programs, each CPU's answer: named
    without the offset, the second would run the first's executable (read the view from element 3, not 5)."""
    env = {"CHILD_KIND": "strided", "HF_TPU_COMPILE_CACHE": "1", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "torch")}
    cold = run(tmp_path / "cache", **env)
    assert cold["traces"] == 2 and cold["graph_cache"]["saved"] == 1 and cold["err"] < TOL, cold
    assert cold["offset_traces"] == 2 and max(cold["offset_errs"]) < TOL, cold  # one program per offset
    assert cold["stats"]["saved"] >= 4 and cold["stats"]["unsaveable"] == 0, cold
    warm = run(tmp_path / "cache", **env)
    assert warm["graph_cache"]["host"]["hits"] == 1, warm
    assert warm["traces"] == 0 and warm["offset_traces"] == 0 and warm["stats"]["misses"] == 0, warm
    assert warm["stats"]["hits"] == cold["stats"]["saved"] and warm["bits"] == cold["bits"] and warm["err"] < TOL, warm
    assert max(warm["offset_errs"]) < TOL, warm


def test_fused_optimizer_steps_trace_nothing_in_a_second_process(tmp_path: Path) -> None:
    """The fused AdamW step's program (optim_lowerings: lists of arrays, traced keyword
    hyperparameters, donated parameters and states) were traced and lowered in every process; shared, the
    second process traces none, donates as the first did and gets the same bits."""
    cold = run(tmp_path / "cache", CHILD_KIND="optim")
    assert cold["traces"] > 0 and cold["err"] < TOL, cold
    assert cold["stats"]["saved"] > 0, cold
    warm = run(tmp_path / "cache", CHILD_KIND="optim")
    assert warm["traces"] == 0 and warm["stats"]["misses"] == 0 and warm["stats"]["hits"] > 0, warm
    assert warm["bits"] == cold["bits"] and warm["err"] < TOL
    assert warm["donated"] == cold["donated"] == [True, True]  # donation survives the executable's trip


def _aot_graphs(name: str = "_QAHead", shape: tuple[int, ...] = (4, 8, 16)) -> list:
    """AOTAutograd's forward and backward graphs of the child's module `name` (traced values: fake tensors)."""
    import torch
    from torch._dynamo.backends.common import aot_autograd

    sys.path.insert(0, str(CHILD.parent))
    try:
        import executable_cache_child
    finally:
        sys.path.pop(0)
    graphs = []

    def keep(gm, example_inputs):  # noqa: ANN001, ANN202
        graphs.append(gm)
        return gm

    torch._dynamo.reset()
    torch.manual_seed(0)
    f = torch.compile(getattr(executable_cache_child, name)(), backend=aot_autograd(fw_compiler=keep, bw_compiler=keep))
    f(torch.randn(*shape)).backward()
    torch._dynamo.reset()
    return graphs


def test_graph_ident_is_the_same_for_the_saved_graph() -> None:
    """graph_ident names a graph as Dynamo made it and as the graph cache gives it back (pickled and loaded:
    meta tensors, not fake ones) alike; it changes with the precision and with a constant."""
    import torch

    from hf_tpu.compile_cache import serializable
    from hf_tpu.graph_ident import graph_ident

    graphs = _aot_graphs()
    assert len(graphs) == 2
    offsets = [n.meta["val"].storage_offset() for g in graphs for n in g.graph.nodes
               if isinstance(n.meta.get("val"), torch.Tensor)]
    assert any(offsets), "no view at a storage offset: the case is not exercised"
    for gm in graphs:
        loaded = serializable._load_graph(serializable._dump_graph(gm))
        # the saved graph keeps the storage offsets (as_strided's lowering reads them); the name ignores them
        def offsets_of(g: torch.fx.GraphModule) -> list[int]:
            return [n.meta["val"].storage_offset() for n in g.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)]

        assert offsets_of(loaded) == offsets_of(gm)
        ident = graph_ident(gm, "highest")
        assert ident is not None and ident == graph_ident(loaded, "highest")
        assert graph_ident(gm, "high") != ident
    fw = graphs[0]
    split = next(n for n in fw.graph.nodes if "split" in str(n.target))
    split.args = (split.args[0], 2, *split.args[2:])  # another constant: another program
    assert graph_ident(fw, "highest") != graph_ident(_aot_graphs()[0], "highest")


def test_as_strided_graph_is_named_with_its_storage() -> None:
    """A graph whose as_strided reads through views is named alike as Dynamo made it and as the graph cache
    gives it back (storage offsets and shared storages kept), and the name changes with the storage offset of
    the value as_strided reads, which no argument and no shape or stride holds."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    from hf_tpu import graph_ident as gi
    from hf_tpu.compile_cache import serializable

    fw = _aot_graphs("_Strided", (4, 8))[0]
    strided = [n for n in fw.graph.nodes if n.target in gi.STORAGE_READERS]
    assert strided and all(gi.storage_source(n) is not n.args[0] for n in strided)  # read through a view
    ident = gi.graph_ident(fw, "highest")
    assert ident is not None and ident == gi.graph_ident(serializable._load_graph(serializable._dump_graph(fw)),
                                                         "highest")
    buf = torch.randn(40)
    names = [gi.graph_ident(make_fx(lambda x: x.as_strided((3, 4), (8, 1), 5) * 2, tracing_mode="fake")(
        buf[off:off + 32]), "highest") for off in (2, 0, 2)]
    assert None not in names and names[0] != names[1] and names[0] == names[2]  # only the offset differs


def test_stable_texts() -> None:
    import torch

    from hf_tpu.executable_cache import Unstable, stable

    assert len({stable(v) for v in (1, 1.0, True, -0.0, 0.0, "1", None)}) == 7
    assert stable((1, [2.5, torch.float32], torch.ops.aten.add.Tensor)) == stable((1, [2.5, torch.float32],
                                                                                   torch.ops.aten.add.Tensor))
    for bad in (object(), lambda x: x, torch.ones(2), [1, object()]):
        with pytest.raises(Unstable):
            stable(bad)


def test_programs_calling_jaxlib_kernels_run_in_a_fresh_process(tmp_path: Path) -> None:
    """A LAPACK-backed op (det: LU through jaxlib's `lapack_sgetrf_ffi` custom call) deserialized in a
    process that had not lowered one itself called an unregistered kernel: the second process died with
    SIGSEGV. Such programs are not saved, so every process gets CPU's answer."""
    code = ("import json, torch, hf_tpu; from hf_tpu import executable_cache as e; "
            "a = torch.randn(4, 4, generator=torch.Generator().manual_seed(0)); "
            "print(json.dumps({'err': abs(torch.linalg.det(a.to('tpu')).cpu() - torch.linalg.det(a)).item(), "
            "'stats': e.stats()}))")
    env = {**os.environ, "HF_TPU_CACHE_DIR": str(tmp_path / "cache"), "HF_TPU_EXECUTABLE_CACHE": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])}
    env.pop("HF_TPU_DISABLE_DISK_CACHE", None)
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-3000:]}"
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out["err"] < 1e-5 and out["stats"]["unsaveable"] >= 1


def test_lowered_key_names_what_the_module_does_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`lambda x, y: 2 * x` and `lambda x, y: 2 * y` lower to the same module (jit drops the unused argument);
    keyed by the module alone, the second program would be served the first's executable and return 2 * x."""
    from hf_tpu import executable_cache, executable_keys, runtime

    monkeypatch.setenv("HF_TPU_CACHE_DIR", str(tmp_path))
    jax = runtime.jax()
    x, y = jax.numpy.arange(3.0), jax.numpy.arange(3.0) + 10
    first, second = jax.jit(lambda a, b: 2 * a), jax.jit(lambda a, b: 2 * b)
    assert executable_keys._module_bytes(first.lower(x, y)) == executable_keys._module_bytes(second.lower(x, y))
    executable_cache.reset_stats()
    one = executable_cache.Program("test|first", {"fast": (first, None)}, lambda args: "fast")
    two = executable_cache.Program("test|second", {"fast": (second, None)}, lambda args: "fast")
    assert (one(x, y) == 2 * x).all() and (two(x, y) == 2 * y).all()
    assert executable_cache.stats()["lowered_hits"] == 0 and executable_cache.stats()["saved"] == 2
    # and the same computation written elsewhere (other source lines: another commit) has the same key
    again = jax.jit(lambda a, b: 2 * b)
    assert "loc(" in again.lower(x, y).as_text(debug_info=True)  # the locations the key leaves out
    three = executable_cache.Program("test|third", {"fast": (again, None)}, lambda args: "fast")
    assert (three(x, y) == 2 * y).all() and executable_cache.stats()["lowered_hits"] == 1

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The graph cache across processes (hf_tpu/compile_cache) is off for the suite: tests count Dynamo graphs
# and compilations, which a warm cache (~/.cache/hf_tpu/graphs) would turn into hits. The cache's own tests
# (tests/hf_tpu/test_graph_cache.py) turn it on, each with its own directories.
os.environ.setdefault("HF_TPU_COMPILE_CACHE", "0")
# Likewise the sweep's timings file (harness/sweep/timings.py): no test sweep reorders or writes the
# user's ~/.cache/hf_tpu/sweep-timings.json; tests/harness/sweep/test_timings.py sets its own.
os.environ.setdefault("HF_TPU_SWEEP_TIMINGS", "0")


# CPU seconds per test (this process plus the subprocesses it waited for), written as JSON lines to the file
# named by HF_TPU_TEST_CPU_TIMES. Wall-clock durations mean little on a loaded 2-core machine, and the fast
# suite has a time budget (CI's 15 minutes); CPU seconds say which tests to slim or mark slow.
_CPU_TIMES = os.environ.get("HF_TPU_TEST_CPU_TIMES")

if _CPU_TIMES:
    import json
    import resource
    import time

    import pytest

    def _cpu_seconds() -> float:
        own = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        cpu0, wall0 = _cpu_seconds(), time.perf_counter()
        yield
        with open(_CPU_TIMES, "a") as f:
            f.write(json.dumps({"test": item.nodeid, "cpu_s": round(_cpu_seconds() - cpu0, 2),
                                "wall_s": round(time.perf_counter() - wall0, 2)}) + "\n")

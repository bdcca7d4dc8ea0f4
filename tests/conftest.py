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

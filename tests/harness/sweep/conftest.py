import pytest


@pytest.fixture
def cpu_opts(tmp_path):
    from harness.sweep.options import SweepOptions

    return SweepOptions(zoo="test", device="cpu", out=str(tmp_path / "run"), run_id="t", timeout=10,
                        memory_cap_gb=1.5, progress="none", repeats=1)

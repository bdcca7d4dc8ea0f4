import io

from harness.sweep.progress import Progress


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_lines_mode_counts_per_status_and_eta():
    s = io.StringIO()
    with Progress(3, already=[{"entry_id": "a", "status": "pass"}], mode="auto", stream=s) as p:
        p.entry_done("b", [{"mode": "eager", "status": "crash"}, {"mode": "compiled", "status": "pass"}], 1.0)
    line = s.getvalue().strip()
    assert line.startswith("[2/3] eta") and "b: eager=crash compiled=pass" in line and "pass=2 crash=1" in line


def test_bar_mode_on_a_terminal():
    s = _Tty()
    with Progress(2, mode="auto", stream=s) as p:
        assert p.mode == "bar"
        p.entry_done("a", [{"mode": "eager", "status": "timeout"}])
        p.entry_done("b", [{"mode": "eager", "status": "pass"}])
    out = s.getvalue()
    assert "2/2" in out and "timeout 1" in out and "pass 1" in out and "ETA" in out

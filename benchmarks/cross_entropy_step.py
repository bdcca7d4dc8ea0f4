"""A language model's loss step alone: cross-entropy forward and backward over GPT-2's logits (4 x 128 x 50,257,
bfloat16 cast to float32 as Transformers' loss does), on CPU eager, tpu compiled and tpu eager, median of 5
timed calls after 3 warm-up ones (wall and CPU ms). Not a test: run it alone.

  python benchmarks/cross_entropy_step.py
"""
import time, sys, torch
import hf_tpu
torch.set_float32_matmul_precision("highest")
def run(dev, compiled):
    torch.manual_seed(0)
    logits = (torch.randn(4, 128, 50257) * 3).bfloat16().to(dev).requires_grad_()
    labels = torch.randint(0, 50257, (4, 128)).to(dev)
    def f(l, y):
        return torch.nn.functional.cross_entropy(l.float().view(-1, 50257), y.view(-1))
    g = torch.compile(f, backend="tpu") if compiled else f
    ts = []
    for i in range(8):
        t, c = time.perf_counter(), time.process_time()
        loss = g(logits, labels); loss.backward(); logits.grad.float().sum().item(); logits.grad = None
        ts.append((time.perf_counter() - t, time.process_time() - c))
    ts = sorted(ts[3:])
    print(dev, "compiled" if compiled else "eager", f"wall {ts[2][0]*1e3:.0f} ms cpu {ts[2][1]*1e3:.0f} ms (min {ts[0][0]*1e3:.0f})")
run("cpu", False); run("tpu", True); run("tpu", False)

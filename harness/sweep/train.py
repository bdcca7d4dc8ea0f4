"""The sweep's train phase (issue 27): N AdamW steps of an entry on tpu and on CPU from the same weights and
data, compared step by step with the numerics rule (harness/sweep/numerics.py).

- The model is in eval() mode: dropout off (and batch norm on its running statistics), so that tpu and CPU
  compute the same function; gradients flow all the same.
- The loss is the model's own where its output has one (`loss`; causal-lm entries get labels = input_ids when
  their forward takes labels); otherwise a fixed reduction of its outputs: the sum over floating output tensors
  that depend on the parameters of mean(t.float() ** 2). Squares, not plain means: the mean of a softmax or a
  normalised output is constant and has no gradient. Data-dependent outputs (tolerances.yaml `data_dependent`:
  a detector's thresholded keypoints, scores and descriptors) are left out of that sum: a float32 rounding that
  flips a threshold changes which elements it holds, and the loss jumps (SuperPoint's, over its selections,
  was 4.6% of its scale between float32 and float64 on CPU itself).
- A parameter without a gradient (it feeds only outputs the loss leaves out) has a zero one: torch.compile's
  AOTAutograd materialises those zeros where eager autograd leaves `.grad` None, and both mean the same.
- Compared (names in the row's error message): loss.stepK for every step, grad_norm.step1, grad.<param> of
  step 1 (a wrong backward names its parameter), weight.<param> after the last step, judged beyond what AdamW's
  normalisation can make of the gradients' permitted rounding (harness/sweep/train_weights.py: a zero-initialised
  bias is nothing but its updates, and a gradient element within noise of zero moves it by +-lr either way).
- A step that raises names itself in `failed_at`: "step K forward | backward | optimizer".
- Gradients that are zero in exact arithmetic (a bias before a normalisation, a key bias under softmax) are
  float32 rounding noise on CPU and tpu alike, and so are the updates AdamW makes from them (it normalises the
  gradient's size away). Such a parameter, told by its float64 gradient (below NULL_GRADIENT of its float32
  one), has its gradient and final weight left out of the comparison, and the row's message says which.
  It is also frozen: the optimizer does not step it, in the CPU, float64 and tpu runs alike. Its noise-driven
  moves (+-lr per element and step, in directions no two runs share) would otherwise reach the losses of steps
  2 and later wherever the loss depends on its value (BLIP-2's query tokens: zero gradient at the initial
  weights, 43 parameters, every train row failed on loss.step3 by that noise alone). In exact arithmetic
  AdamW's update of a zero gradient is zero; freezing drops only its decoupled weight decay (a factor
  1 - lr * 0.01 per step), the same in every run. To freeze the same parameters before any run steps, the CPU
  baseline pauses after step 1's backward while the float64 reference runs (runner.run_train_phase), so the
  two models are held at once. Without a float64 run nothing is known null and nothing is frozen.
- A float64 reference refused because the CPU baseline's own rounding is far from it (BLIP-2's vision tower)
  cannot judge tpu by the rule; the row is an uninformative pass when tpu is within 3x float32's spread of
  float64 on every tensor, the spread measured by the baseline and a second CPU run from weights nudged by one
  ulp (`nudged`, rounding_dominated; docs/numerics.md), else fail_accuracy.
- A row the rule fails against a valid reference gets the nudged run too (only such rows pay for it): it is
  an uninformative pass when tpu is within the rule's factor x float32's spread on every failing tensor
  (train_spread.within_spread: BioGPT's q_proj.bias, where later Adam steps amplify rounding and CPU landed
  near float64 by luck); a row near that bound gets up to two more nudged runs (train_spread.py).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Sequence
from typing import Any

from harness.core import errors
from harness.entry_calls import compile_call, failure_status, output_tensors, prepare_inputs, prepare_model
from harness.sweep import draws, numerics, perf, train_carry, train_weights
from harness.sweep.train_null import NULL_GRADIENT, SUBNORMAL, null_gradients, null_note, without  # noqa: F401
from harness.sweep.train_spread import FLUSH, NUDGE_SEEDS, flush_reach, flushing, near_bound, within_spread

LR = 1e-4  # small: Adam's update is ~lr per element whatever the gradient, so weights stay comparable
# Gradients and AdamW steps amplify float32 rounding (sums with cancellation: Bart's layer-norm weight gradient
# is 1.6e-3 of its scale off float64 on CPU itself), so the float64 reference of the train phase is valid up to
# this many times the forward's bound (tolerances.yaml `reference`); a reference that took another path or drew
# other numbers is off by O(1), and with it valid the rule compares tpu's error with CPU's own.
REFERENCE_FACTOR = 10.0


def not_trainable(model: Any) -> str:
    """Why an entry's model cannot be trained ('' when it can): a pipeline is not a module, and its __call__
    runs under no_grad; its models are entries of their own."""
    import torch

    if isinstance(model, torch.nn.Module):
        return ""
    return (f"not trainable: {type(model).__name__} is not a torch.nn.Module (a pipeline calls its models under "
            "no_grad); its models are trained as entries of their own")
STAGES = ("forward", "backward", "optimizer")
_FUSED: dict[str, str] = {}  # device -> "" (fused AdamW works) or why not


class StepError(Exception):
    """A training step raised: `stage` says where ("step K forward|backward|optimizer")."""

    def __init__(self, stage: str, exc: BaseException):
        super().__init__(f"{stage}: {type(exc).__name__}: {exc}")
        self.stage, self.exc = stage, exc


def scalar_loss(output: Any, exclude: tuple[str, ...] = ()):
    """The model's own loss if it returned one, else sum of mean(t**2) over its differentiable float outputs
    except the `exclude`d ones (data-dependent outputs: a name or its dotted prefix)."""
    import torch

    loss = output.get("loss") if hasattr(output, "get") else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.requires_grad:
        return loss.reshape(())
    terms = [t.float().pow(2).mean() for name, t in output_tensors(output).items()
             if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point()
             and not any(name == x or name.startswith(x + ".") for x in exclude)]
    if not terms:
        raise ValueError("no output depends on a trainable parameter" + (
            f" apart from the data-dependent ones ({', '.join(exclude)})" if exclude else "") + ": nothing to train")
    return torch.stack([t.reshape(()) for t in terms]).sum()


def train_inputs(entry: Any, model: Any, inputs: dict) -> dict:
    """The entry's inputs, with labels = input_ids for a causal LM whose forward takes labels (its own loss)."""
    if entry.task != "causal-lm" or "labels" in inputs or "input_ids" not in inputs:
        return inputs
    try:
        takes = "labels" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        takes = False
    return {**inputs, "labels": inputs["input_ids"]} if takes else inputs


def fused_support(device: str) -> str:
    """'' when AdamW(fused=True) steps on `device`, else why not (probed once per process on a 2-element
    parameter): until the device has fused optimizer kernels, the sweep falls back to foreach and says so."""
    if device not in _FUSED:
        import torch

        try:
            p = torch.zeros(2, device=device, requires_grad=True)
            p.grad = torch.ones(2, device=device)
            torch.optim.AdamW([p], lr=LR, fused=True).step()
            p.detach().cpu()
            _FUSED[device] = ""
        except Exception as exc:  # noqa: BLE001
            _FUSED[device] = errors.normalise(f"{type(exc).__name__}: {exc}")[:200]
    return _FUSED[device]


def make_optimizer(params: list, device: str | None):
    """(optimizer, label): fused AdamW on an accelerator that supports it, else foreach (CPU: the default)."""
    import torch

    if device is None or device == "cpu":
        return torch.optim.AdamW(params, lr=LR, foreach=False), "AdamW for-loop (cpu)"
    why = fused_support(device)
    if not why:
        return torch.optim.AdamW(params, lr=LR, fused=True), "AdamW fused"
    return torch.optim.AdamW(params, lr=LR, foreach=True), f"AdamW foreach (fused: {why})"


def _to_cpu(t):
    return t.detach().to("cpu")


def run_steps(built: Any, entry: Any, device: str | None, steps: int, dtype: Any = None, seed: int = 0,
              rebuild: Callable | None = None, compile_backend: Any = None, context: Callable | None = None,
              counter: Callable[[], int | None] | None = None, max_extra: int = 0,
              exclude: tuple[str, ...] = (), freeze: Sequence[str] | Callable[[dict], Sequence[str]] = (),
              nudge: int | None = None, trace: bool = False, states: bool = False,
              start: dict | None = None) -> dict:
    """Train a fresh copy of the entry's model for `steps` steps on `device` (None: CPU). Returns {"tensors":
    named CPU tensors to compare, "times": seconds per step, "counts": compile count after each step,
    "optimizer": label, "frozen": the parameters the optimizer left alone, "extra_times"/"extra_counts": up to
    `max_extra` further steps run only while the compile count is not yet stable (warmup, not compared)}.
    `exclude`: outputs the fixed loss leaves out (scalar_loss). `freeze`: parameters the optimizer does not
    step (null gradients: they still get gradients, which are recorded), or a function of step 1's recorded
    tensors that names them, called after step 1's backward outside `context` and the timing (the CPU baseline
    runs the float64 reference there: null_gradients needs both step-1 gradients before either steps).
    `nudge`: a seed; every floating parameter element starts one ulp up or down (a seeded coin), the spread
    run's float32 sample (nudged). `trace`: also "trace", every step's record (list index k: "loss", "grad" and
    "weight" after its optimizer step, CPU copies by parameter name; index 0: the initial "weight"), and
    "order", the parameters in the order step 1's backward produced their gradients (hf-tpu diagnose walks
    the steps with them). `states`: each trace entry also holds the buffers and AdamW's state after it
    (train_carry.snapshot). `start`: such a trace entry to start from (its weights, buffers, AdamW's state:
    train_carry's transition check). Raises StepError."""
    import contextlib

    import torch

    model = prepare_model(built.model, device, dtype, rebuild)
    model.eval()  # dropout off
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad and p.is_floating_point()]
    if nudge is not None:
        _nudge([p for _, p in params], nudge)
    if not params:
        raise StepError("step 1 forward", ValueError("the model has no trainable floating-point parameters"))
    if start is not None:
        train_carry.load_model(model, params, start)
    frozen: set[str] = set() if callable(freeze) else set(freeze)
    opt, label = None, ""
    fn = built.call if compile_backend is None else compile_call(built.call, model, compile_backend)
    inputs = train_inputs(entry, model, prepare_inputs(built.inputs, device, dtype))
    out: dict = {}
    times, counts = [], []
    ctx = context or contextlib.nullcontext
    steps_trace: list[dict] = []
    order: list[str] = []
    seen: set[str] = set()
    if trace:  # copies: a CPU parameter's detach() is its storage, which the optimizer steps in place
        steps_trace.append({"weight": {n: p.detach().to("cpu", copy=True) for n, p in params},
                            **(train_carry.snapshot(model, params, None) if states else {})})
        def produced(name: str) -> None:
            if name not in seen:
                seen.add(name)
                order.append(name)
        for n, p in params:
            p.register_post_accumulate_grad_hook(lambda _p, _n=n: produced(_n))

    def one_step(k: int, record: bool) -> None:
        nonlocal opt, label, frozen
        stage = f"step {k} forward"
        with contextlib.ExitStack() as stack:
            try:
                # train() then eval() drops what a model caches across calls in eval mode, Transformers' own way
                # (LeViT's attention biases: an indexed parameter whose graph step 1's backward frees; the
                # build's no_grad calibration forwards had left one without any gradient in the CPU baseline)
                model.train()
                model.eval()
                stack.enter_context(ctx())
                stack.enter_context(draws.shared_draws(seed))  # a forward's random draws: one seeded CPU stream
                torch.manual_seed(seed)
                t0 = time.perf_counter()
                for _, p in params:  # zero_grad(set_to_none=True) of every parameter, the frozen ones too
                    p.grad = None
                loss = scalar_loss(fn(model, inputs), exclude)
                stage = f"step {k} backward"
                loss.backward()
                if record:
                    out[f"loss.step{k}"] = _to_cpu(loss).double()
                if record and (k == 1 or trace):
                    grads = {n: _to_cpu(p.grad) if p.grad is not None else torch.zeros_like(p, device="cpu")
                             for n, p in params}
                    if trace:
                        steps_trace.append({"loss": out[f"loss.step{k}"], "grad": grads,  # None: not stepped
                                            "nograd": [n for n, p in params if p.grad is None]})
                if record and k == 1:
                    out["grad_norm.step1"] = torch.stack([g.double().norm() for g in grads.values()]).norm() \
                        if grads else torch.zeros((), dtype=torch.float64)
                    out.update({f"grad.{n}": g for n, g in grads.items()})
            except Exception as exc:  # noqa: BLE001
                raise StepError(stage, exc) from exc
            gap = 0.0
            if not label:  # step 1: the optimizer over the parameters not frozen, untimed (as it was before step 1)
                g0 = time.perf_counter()
                if callable(freeze):
                    stack.close()  # the function runs outside this run's contexts (another run's, in float64)
                    frozen = set(freeze(out))
                    stack.enter_context(ctx())
                stepped = [p for n, p in params if n not in frozen]
                opt, label = make_optimizer(stepped, device) if stepped else (None, "none (every parameter frozen)")
                if start is not None and opt is not None:
                    train_carry.load_optimizer(opt, params, start)
                gap = time.perf_counter() - g0
            stage = f"step {k} optimizer"
            try:
                if opt is not None:
                    opt.step()
                if device is not None:
                    params[0][1].detach().cpu()  # wait for the step (a lazy device runs it here)
                times.append(time.perf_counter() - t0 - gap)
            except Exception as exc:  # noqa: BLE001
                raise StepError(stage, exc) from exc
            if trace and record:
                steps_trace[k]["weight"] = {n: p.detach().to("cpu", copy=True) for n, p in params}
                if states:
                    steps_trace[k].update(train_carry.snapshot(model, params, opt))
        counts.append(counter() if counter else None)

    with torch.enable_grad():
        for k in range(1, steps + 1):
            one_step(k, True)
        out.update({f"weight.{n}": _to_cpu(p) for n, p in params})
        extra = 0
        while counter and extra < max_extra and perf.warmup_steps(counts) is None:
            extra += 1
            one_step(steps + extra, False)
        if counter and max_extra:
            one_step(steps + extra + 1, False)  # one timed step after warmup: does it recompile?
    got = {"tensors": out, "times": times, "counts": counts, "optimizer": label, "frozen": sorted(frozen)}
    return {**got, "trace": steps_trace, "order": order} if trace else got


def run_train(mode: str, built: Any, entry: Any, ref: dict, fp64: dict | None, opts: Any, device: Any,
              tol: numerics.Tolerance, dtype: Any = None, rebuild: Callable | None = None,
              eager_mode: Callable | None = None, null: list[str] = (), allow: dict | None = None,
              noisy_fp64: dict | None = None, spread: dict | Callable[[], dict | None] | None = None) -> dict:
    """The fields of one train row of `mode` (status, metrics, failed_at, optimizer, performance). `ref`
    and `fp64` are run_steps(...)["tensors"] of the CPU baseline and the float64 reference (None: invalid),
    without the `null` parameters' tensors (null_gradients), which are left out of tpu's too. `allow`:
    train_weights.allowances(ref, fp64, ...), each final weight's rounding allowance. `noisy_fp64`: the
    float64 run when it was refused for the baseline's own distance from it (`dominated`); `spread`: the
    nudged baseline's tensors (nudged), float32's second sample, or a function that runs it, called only when
    the rule fails the row (then judged by rounding_dominated, or within_spread against a valid reference)."""
    from harness.sweep.device import backend_phase

    device.reset_stats()
    device.set_precision(opts.precision)
    perf.reset_peak_rss()
    start = time.perf_counter()
    row: dict = {}
    stats = None  # the device's counters, read before a transition check's runs where there is one
    steps = getattr(opts, "train_steps", 3)
    backend = None
    if mode == "compiled":
        import torch._dynamo

        torch._dynamo.reset()
        backend = device.compile_backend

    def context():
        import contextlib

        stack = contextlib.ExitStack()
        stack.enter_context(backend_phase())
        if eager_mode is not None:
            stack.enter_context(eager_mode(mode, device))
        return stack

    try:
        got = run_steps(built, entry, device.name, steps, dtype, opts.seed, rebuild, backend, context,
                        counter=lambda: device.stats().get("compilations"), max_extra=perf.MAX_WARMUP,
                        exclude=tol.data_dependent, freeze=null)
    except StepError as err:
        row.update(status=failure_status(err.exc, mode, err.stage.startswith("step 1")),
                   **errors.error_fields(err.exc), failed_at=err.stage)
        row["error_message"] = errors.normalise(f"{err.stage}: {row.get('error_message', '')}")
        if err.stage.endswith("optimizer"):
            row.setdefault("optimizer", _optimizer_label(device.name))
    else:
        times, counts = got["times"], got["counts"]
        w = perf.warmup_steps(counts)
        row.update(optimizer=got["optimizer"], **perf.time_fields(times, w), **perf.perf_fields(counts, w))
        if w is None and all(c is not None for c in counts):
            row["recompiles"] = f"recompiles (compile count not stable in {perf.MAX_WARMUP} warmup steps)"
        if len(times) > 1:
            row["compile_s"] = max(0.0, times[0] - row["run_s"])
        res = without(got["tensors"], list(null))
        spent = [0.0]

        def timed_spread(i: int) -> dict | None:
            t0 = time.perf_counter()
            try:
                return spread(i) if callable(spread) else (spread if i == 0 else None)
            finally:
                spent[0] += time.perf_counter() - t0
        cmp, dominated = judge(ref, res, fp64, tol, allow, noisy_fp64, timed_spread, steps)
        carried = None
        if not (cmp.match or dominated) and not train_carry.step1_fails(ref, res, fp64, tol):
            # the row's columns as they are before the check, which runs tpu's steps again (train_carry.py)
            stats, t0, c0 = device.stats(), time.perf_counter(), time.process_time()
            row["peak_rss_mb"] = perf.peak_rss_mb()
            carried = train_carry.check_row(run_steps, StepError, built, entry, opts, device.name, backend, context,
                                              dtype, rebuild, tol, null, got, cpu_optimizer, REFERENCE_FACTOR)
            spent[0] += time.perf_counter() - t0
            carried.note += f" ({time.process_time() - c0:.1f} CPU-s)"
        start += spent[0]  # the nudged runs and the transition check: not the row's wall time
        row.update(cmp.metrics())
        row["status"] = "pass" if cmp.match or dominated or (carried and carried.ok) else "fail_accuracy"
        if carried and carried.ok:
            key = "uninformative" if carried.uninformative else "error_message"
            row[key] = errors.normalise("; ".join(n for n in (carried.note, null_note(list(null))) if n))
        elif dominated:
            row["uninformative"] = errors.normalise(dominated)  # judged by no rule: out of the denominators
        elif cmp.match:
            amplified = train_weights.rescued_note(train_weights.rescued(ref, res, fp64, tol, allow or {}))
            # the allowance's note first: messages are cut at errors.MESSAGE_LIMIT, and it is the rarer one
            row["error_message"] = errors.normalise("; ".join(n for n in (amplified, null_note(list(null)),
                                                                          cmp.notes) if n))
        else:
            row["error_type"] = "AccuracyError"
            first = first_diverging_grad(ref, got["tensors"], fp64, tol)
            row["error_message"] = errors.normalise((f"{carried.note}; " if carried else "")
                                                    + (f"first diverging gradient: {first}; " if first else "")
                                                    + cmp.reason)
            if first:
                row["located_module"] = first
    stats = stats or device.stats()
    row["compilations"] = stats.get("compilations")
    row["graph_breaks"] = stats.get("graph_breaks")
    row["fallback_ops"] = ";".join(f"{k}:{v}" for k, v in sorted((stats.get("fallback_ops") or {}).items()))
    row.setdefault("peak_rss_mb", perf.peak_rss_mb())
    row["wall_s"] = time.perf_counter() - start
    return row


def cpu_optimizer(params: list) -> Any:
    """The CPU baseline's optimizer over `params` (make_optimizer's)."""
    return make_optimizer(params, None)[0]


def judge(ref: dict, res: dict, fp64: dict | None, tol: numerics.Tolerance, allow: dict | None,
          noisy_fp64: dict | None = None, spread: dict | Callable[[int], dict | None] | None = None,
          steps: int = 3) -> tuple[numerics.Comparison, str]:
    """The rule on a train row's tensors (run_train's arguments; `res` without the null parameters): (the
    comparison, why the row is an uninformative pass: '' when it is not). The sweep's row and `hf-tpu diagnose
    --phase train` judge through this one function, so the two agree. `spread(i)`: the i-th nudged run (seed
    NUDGE_SEEDS[i]; i = FLUSH: the flush-to-zero run, first, when train_spread.flush_reach), asked for only when the rule fails and a float64 run (valid or noisy) can judge float32's
    spread; the second and third only while the row stays near its bound (train_spread.py)."""
    # both float32 sides' final weights less what AdamW can make of their gradients' rounding: what is left
    # of the baseline's distance from float64 bounds tpu's (its raw distance would excuse a wrong update)
    judged = train_weights.shrink(res, fp64 or ref, allow or {})
    base = train_weights.shrink(ref, fp64, allow or {}) if fp64 else ref
    cmp = numerics.compare_outputs(base, judged, fp64, tol)
    dominated = ""
    if cmp.match or not (noisy_fp64 or fp64):
        return cmp, dominated

    def sample(i: int) -> dict | None:  # the nudged runs: only a failing row pays for them
        return spread(i) if callable(spread) else (spread if i == 0 else None)
    if noisy_fp64:
        return cmp, rounding_dominated(ref, res, noisy_fp64, tol, steps, sample(0))
    samples: list[dict] = []
    # a tensor small enough for flushed subnormals to decide it: float32 as a TPU computes it first
    flushed = flush_reach(ref, res, fp64, tol, allow or {})
    order = [FLUSH] * flushed + list(range(len(NUDGE_SEEDS)))
    for i in order:  # more samples of float32's spread only while the row is near its bound
        s = sample(i)
        if s is None:
            if i == FLUSH:
                flushed = False
                continue
            break
        samples.append(s)
        dominated = within_spread(ref, res, fp64, tol, allow or {}, samples, flushed)
        if dominated or not near_bound(ref, res, fp64, tol, allow or {}, samples):
            break
    return cmp, dominated


def rounding_dominated(ref: dict, res: dict, noisy_fp64: dict | None, tol: numerics.Tolerance, steps: int,
                       spread: dict | None = None) -> str:
    """numerics.rounding_dominated for a train row: the float64 run was refused because the CPU baseline's own
    rounding puts a gradient (or what Adam made of it) more than the reference bound of its scale from it (a
    sum with heavy cancellation: Bart's shared embedding gradient 0.19 x scale, BLIP-2's query tokens 2.5 x),
    and every tensor of tpu is within ROUNDING_DOMINATED times CPU's distance of float64: the final weights
    as they are, or all of them judged beyond Adam's amplification of the gradients' rounding on both sides
    (train_weights.py; that alone fails where it leaves CPU nothing and tpu a little: Bart's last layer-norm
    bias, whose raw distance is within 1.3x CPU's). Then the row cannot be judged by the rule: an uninformative pass,
    out of the numerics denominators. Why ('' when it is not such a row). `spread`: the nudged baseline
    (nudged); CPU's distance from float64 is then float32's spread over both runs (numerics.rounding_dominated's
    `alt`), since one run can land near float64 by chance on a tensor float32 does not determine."""
    if not noisy_fp64:
        return ""
    raw = numerics.rounding_dominated(ref, res, noisy_fp64, tol, spread)
    if raw:
        return raw
    allow = train_weights.allowances(ref, noisy_fp64, tol, steps, LR)
    return numerics.rounding_dominated(train_weights.shrink(ref, noisy_fp64, allow),
                                       train_weights.shrink(res, noisy_fp64, allow), noisy_fp64, tol,
                                       train_weights.shrink(spread, noisy_fp64, allow) if spread else None)


NUDGE_SEED = NUDGE_SEEDS[0]  # the first nudged run's coin seed (train_spread.NUDGE_SEEDS)


def _nudge(params: Sequence[Any], seed: int) -> None:
    """Move each element of `params` one ulp up or down, by a seeded coin: a perturbation of the size of the
    rounding every float32 run makes, so the run that starts there is another sample of float32's result."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in params:
            up = torch.rand(p.shape, generator=g) < 0.5
            inf = torch.tensor(float("inf"), dtype=p.dtype)
            p.copy_(torch.nextafter(p, torch.where(up.to(p.device), inf.to(p.device), -inf.to(p.device))))


def nudged(built: Any, entry: Any, opts: Any, dtype: Any, rebuild: Callable | None, context: Callable | None,
           exclude: tuple[str, ...], null: Sequence[str], seed: int | str = NUDGE_SEED) -> dict | None:
    """The CPU baseline run again from weights nudged by one ulp (_nudge), the `null` parameters frozen as
    in every run: float32's second sample, for a row whose float64 reference was refused for the baseline's
    own distance from it (rounding_dominated). `seed` FLUSH: not nudged but run with subnormals flushed to
    zero (train_spread.flush_to_zero). Its tensors without the null ones, or None if it raises."""
    try:
        got = run_steps(built, entry, None, getattr(opts, "train_steps", 3), dtype, opts.seed, rebuild,
                        context=flushing(context) if seed == FLUSH else context, exclude=exclude, freeze=list(null), nudge=None if seed == FLUSH else seed)
    except StepError:  # a CPU without flush-to-zero raises it in the step's context: no such sample
        return None
    return without(got["tensors"], list(null))


def _optimizer_label(device: str) -> str:
    why = fused_support(device)
    return "AdamW fused" if not why else f"AdamW foreach (fused: {why})"


def first_diverging_grad(ref: dict, res: dict, fp64: dict | None, tol: numerics.Tolerance) -> str:
    """The first parameter (in the model's order) whose step-1 gradient fails the numerics rule, or ''."""
    for name in ref:
        if not name.startswith("grad.") or name not in res:
            continue
        ok, _, _ = numerics.compare_tensor(name, ref[name], res[name], (fp64 or {}).get(name), tol)
        if not ok:
            return name[len("grad."):]
    return ""

"""torch.tpu.optimizers: torch_tpu's stateless functional optimizers (`group = opt.init_param_group(model)`,
`group = opt.step(group, grads)`), each step one call of PyTorch's own functional optimizer
(torch.optim.adamw.adamw, torch.optim.sgd.sgd, torch.optim._muon.muon)."""

from __future__ import annotations

import abc
import dataclasses
import types
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch.optim import _muon, adamw as _adamw, sgd as _sgd


def _named(params: dict[str, torch.Tensor] | torch.nn.Module) -> dict[str, torch.Tensor]:
    if isinstance(params, torch.nn.Module):
        return {name.replace(".", "_"): p.detach() for name, p in params.named_parameters()}
    return dict(params)


def _capturable(tensors: list[torch.Tensor], wanted: bool) -> bool:
    # torch.optim allows capturable steps only on accelerators; TorchTPU's default (True) on a CPU tensor
    # would raise, and the update is the same either way.
    return wanted and all(t.device.type != "cpu" for t in tensors)


class Optimizer(abc.ABC):
    """Base of the stateless functional optimizers: hyperparameters fixed at construction (`defaults`)."""

    ParamGroup: ClassVar[Any]
    _HYPERPARAMETER_NAMES: ClassVar[tuple[str, ...]] = ("lr", "weight_decay")

    def __init__(self, lr: float = 1e-3, weight_decay: float = 0.0) -> None:
        self._lr = lr
        self._weight_decay = weight_decay

    @property
    def defaults(self) -> Mapping[str, Any]:
        return types.MappingProxyType({n: getattr(self, f"_{n}") for n in self._HYPERPARAMETER_NAMES})

    @abc.abstractmethod
    def init_param_group(self, params: dict[str, torch.Tensor] | torch.nn.Module) -> Any: ...

    @abc.abstractmethod
    def step(self, param_group: Any, grads: dict[str, torch.Tensor]) -> Any: ...

    def __call__(self, param_group: Any, grads: dict[str, torch.Tensor]) -> Any:
        return self.step(param_group, grads)

    @staticmethod
    def _grads(param_group: Any, grads: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        missing = [k for k in param_group.params if k not in grads]
        if missing:
            raise KeyError(f"no gradient for parameters {missing}: grads needs one entry per param_group.params key")
        return [grads[k] for k in param_group.params]


def _zeros(params: dict[str, torch.Tensor], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    return {n: torch.zeros_like(p, dtype=dtype, memory_format=torch.preserve_format) for n, p in params.items()}


def _steps(params: dict[str, torch.Tensor], start: float) -> dict[str, torch.Tensor]:
    return {n: torch.tensor(start, dtype=torch.float32, device=p.device) for n, p in params.items()}


class AdamW(Optimizer):
    """AdamW (decoupled weight decay). With use_bfloat16_moments (TorchTPU's default) the moments are kept
    in bfloat16 between steps and updated in float32."""

    @dataclasses.dataclass
    class ParamGroup:
        params: dict[str, torch.Tensor]
        opt_state_m: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
        opt_state_v: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
        opt_steps: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)

    _HYPERPARAMETER_NAMES = ("lr", "weight_decay", "beta1", "beta2", "eps", "use_bfloat16_moments", "amsgrad",
                             "maximize", "foreach", "capturable", "differentiable", "fused", "grad_scale",
                             "found_inf")

    def __init__(self, lr: float = 1e-3, weight_decay: float = 1e-2, beta1: float = 0.9, beta2: float = 0.999,
                 eps: float = 1e-8, use_bfloat16_moments: bool = True, amsgrad: bool = False,
                 maximize: bool = False, foreach: bool | None = False, capturable: bool = True,
                 differentiable: bool = False, fused: bool | None = False, grad_scale: torch.Tensor | None = None,
                 found_inf: torch.Tensor | None = None) -> None:
        super().__init__(lr=lr, weight_decay=weight_decay)
        self._beta1, self._beta2, self._eps = beta1, beta2, eps
        self._use_bfloat16_moments = use_bfloat16_moments
        self._amsgrad, self._maximize, self._foreach = amsgrad, maximize, foreach
        self._capturable, self._differentiable, self._fused = capturable, differentiable, fused
        self._grad_scale, self._found_inf = grad_scale, found_inf

    def init_param_group(self, params: dict[str, torch.Tensor] | torch.nn.Module) -> AdamW.ParamGroup:
        params = _named(params)
        dtype = torch.bfloat16 if self._use_bfloat16_moments else None
        return self.ParamGroup(params=params, opt_state_m=_zeros(params, dtype), opt_state_v=_zeros(params, dtype),
                               opt_steps=_steps(params, 0.0))

    def step(self, param_group: AdamW.ParamGroup, grads: dict[str, torch.Tensor]) -> AdamW.ParamGroup:
        keys = list(param_group.params)
        params = [param_group.params[k] for k in keys]
        m = [param_group.opt_state_m[k] for k in keys]
        v = [param_group.opt_state_v[k] for k in keys]
        m32 = [t.float() if t.dtype == torch.bfloat16 else t for t in m]
        v32 = [t.float() if t.dtype == torch.bfloat16 else t for t in v]
        _adamw.adamw(params, self._grads(param_group, grads), m32, v32, [], [param_group.opt_steps[k] for k in keys],
                     foreach=self._foreach, capturable=_capturable(params, self._capturable),
                     differentiable=self._differentiable, fused=self._fused, grad_scale=self._grad_scale,
                     found_inf=self._found_inf, amsgrad=self._amsgrad, beta1=self._beta1, beta2=self._beta2,
                     lr=self._lr, weight_decay=self._weight_decay, eps=self._eps, maximize=self._maximize)
        for dst, src in [*zip(m, m32), *zip(v, v32)]:
            if dst is not src:
                dst.copy_(src)
        return param_group


class Sgd(Optimizer):
    """SGD with optional momentum, dampening, Nesterov and weight decay (torch.optim.SGD's update)."""

    @dataclasses.dataclass
    class ParamGroup:
        params: dict[str, torch.Tensor]
        opt_state_m: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
        opt_steps: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)

    _HYPERPARAMETER_NAMES = ("lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize", "foreach",
                             "fused", "grad_scale", "found_inf", "has_sparse_grad")

    def __init__(self, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0, weight_decay: float = 0.0,
                 nesterov: bool = False, maximize: bool = False, foreach: bool | None = False,
                 fused: bool | None = True, grad_scale: torch.Tensor | None = None,
                 found_inf: torch.Tensor | None = None, has_sparse_grad: bool = False) -> None:
        super().__init__(lr=lr, weight_decay=weight_decay)
        self._momentum, self._dampening, self._nesterov = momentum, dampening, nesterov
        self._maximize, self._foreach, self._fused = maximize, foreach, fused
        self._grad_scale, self._found_inf, self._has_sparse_grad = grad_scale, found_inf, has_sparse_grad

    def init_param_group(self, params: dict[str, torch.Tensor] | torch.nn.Module) -> Sgd.ParamGroup:
        params = _named(params)
        m = _zeros(params, None) if self._momentum != 0.0 else {}
        return self.ParamGroup(params=params, opt_state_m=m, opt_steps=_steps(params, 1.0))

    def step(self, param_group: Sgd.ParamGroup, grads: dict[str, torch.Tensor]) -> Sgd.ParamGroup:
        keys = list(param_group.params)
        params = [param_group.params[k] for k in keys]
        bufs: list[torch.Tensor | None] = []
        if self._momentum != 0.0:
            # The first step starts the buffer at the gradient (torch.optim.SGD): torch's sgd does that for a
            # None buffer and hands the new buffer back through the list.
            bufs = [None if float(param_group.opt_steps[k]) == 1.0 else param_group.opt_state_m[k] for k in keys]
        fused = self._fused and all(p.device.type in ("cpu", "cuda", "mps") for p in params)
        _sgd.sgd(params, self._grads(param_group, grads), bufs, has_sparse_grad=self._has_sparse_grad,
                 foreach=self._foreach, fused=fused, grad_scale=self._grad_scale, found_inf=self._found_inf,
                 weight_decay=self._weight_decay, momentum=self._momentum, lr=self._lr,
                 dampening=self._dampening, nesterov=self._nesterov, maximize=self._maximize)
        for k, buf in zip(keys, bufs):
            if buf is not None and buf is not param_group.opt_state_m[k]:
                param_group.opt_state_m[k].copy_(buf)
        torch._foreach_add_([param_group.opt_steps[k] for k in keys], 1.0)
        return param_group


class Muon(Optimizer):
    """Muon (Jordan et al. 2024): momentum, Newton-Schulz orthogonalisation of the (Nesterov) update in
    bfloat16, decoupled weight decay, learning rate scaled by the matrix shape. 2-D parameters only."""

    @dataclasses.dataclass
    class ParamGroup:
        params: dict[str, torch.Tensor]
        opt_state_m: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
        opt_steps: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)

    _HYPERPARAMETER_NAMES = ("lr", "weight_decay", "momentum", "nesterov", "ns_coefficients", "eps", "ns_steps",
                             "adjust_lr_fn", "use_bfloat16_moments", "foreach", "has_complex")

    def __init__(self, lr: float = 1e-3, weight_decay: float = 0.1, momentum: float = 0.95, nesterov: bool = True,
                 ns_coefficients: tuple[float, float, float] = (3.4445, -4.7750, 2.0315), eps: float = 1e-7,
                 ns_steps: int = 5, adjust_lr_fn: str | None = None, use_bfloat16_moments: bool = False,
                 foreach: bool | None = False, has_complex: bool = False) -> None:
        super().__init__(lr=lr, weight_decay=weight_decay)
        self._momentum, self._nesterov = momentum, nesterov
        self._ns_coefficients, self._eps, self._ns_steps = ns_coefficients, eps, ns_steps
        self._adjust_lr_fn, self._use_bfloat16_moments = adjust_lr_fn, use_bfloat16_moments
        self._foreach, self._has_complex = foreach, has_complex

    def init_param_group(self, params: dict[str, torch.Tensor] | torch.nn.Module) -> Muon.ParamGroup:
        params = _named(params)
        not_2d = [n for n, p in params.items() if p.dim() != 2]
        if not_2d:
            raise ValueError(f"Muon updates 2-D parameters only; {not_2d} are not (use AdamW for them)")
        dtype = torch.bfloat16 if self._use_bfloat16_moments else None
        return self.ParamGroup(params=params, opt_state_m=_zeros(params, dtype), opt_steps=_steps(params, 1.0))

    def step(self, param_group: Muon.ParamGroup, grads: dict[str, torch.Tensor]) -> Muon.ParamGroup:
        keys = list(param_group.params)
        _muon.muon([param_group.params[k] for k in keys], self._grads(param_group, grads),
                   [param_group.opt_state_m[k] for k in keys], foreach=self._foreach, lr=self._lr,
                   weight_decay=self._weight_decay, momentum=self._momentum, nesterov=self._nesterov,
                   ns_coefficients=self._ns_coefficients, ns_steps=self._ns_steps, eps=self._eps,
                   adjust_lr_fn=self._adjust_lr_fn, has_complex=self._has_complex)
        torch._foreach_add_([param_group.opt_steps[k] for k in keys], 1.0)
        return param_group

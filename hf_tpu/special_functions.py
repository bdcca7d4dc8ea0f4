"""torch.special functions that neither torchax nor PyTorch's decompositions lower: airy_ai,
scaled_modified_bessel_k0/k1 and spherical_bessel_j0 (PyTorch's reference of spherical_bessel_j0 calls the op
itself, so its "decomposition" recursed without end); and zeta, torchax's with CPU's domain.

No JAX function computes these (jax.scipy.special has no Airy function and no exponentially scaled K), so each
is CPU's kernel (ATen/native/Math.h, from the Cephes library) written with the same coefficient tables,
branches and evaluation order, in the input's float dtype; integers and bools are promoted to the default
float dtype first, as PyTorch's unary float ops do.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from hf_tpu.op_registry import lowers

aten = torch.ops.aten


def _jax() -> Any:
    from hf_tpu import runtime

    return runtime.jax()


def _float(x: Any) -> Any:
    jnp = _jax().numpy
    from hf_tpu import dtypes

    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(dtypes.to_jax(torch.get_default_dtype()))
    return x


def _horner(z: Any, coeffs: tuple[float, ...]) -> Any:
    """sum_i coeffs[i] z^(n-1-i), evaluated as CPU's loops `acc = acc * z + c[i]` starting from 0."""
    acc = _jax().numpy.zeros_like(z)
    for c in coeffs:
        acc = acc * z + c
    return acc


def _chbevl(y: Any, coeffs: tuple[float, ...]) -> Any:
    """Cephes' Chebyshev series as the scaled Bessel K kernels inline it: a = c0; (p, q, a) = (q, a, y*a - q + c)."""
    jnp = _jax().numpy
    p = q = jnp.zeros_like(y)
    a = jnp.full_like(y, coeffs[0])
    for c in coeffs[1:]:
        p, q = q, a
        a = y * q - p + c
    return 0.5 * (a - p)


_AI_AN = (3.46538101525629032477e-01, 1.20075952739645805542e+01, 7.62796053615234516538e+01,
          1.68089224934630576269e+02, 1.59756391350164413639e+02, 7.05360906840444183113e+01,
          1.40264691163389668864e+01, 9.99999999999999995305e-01)
_AI_AD = (5.67594532638770212846e-01, 1.47562562584847203173e+01, 8.45138970141474626562e+01,
          1.77318088145400459522e+02, 1.64234692871529701831e+02, 7.14778400825575695274e+01,
          1.40959135607834029598e+01, 1.00000000000000000470e+00)
_AI_AFN = (-1.31696323418331795333e-01, -6.26456544431912369773e-01, -6.93158036036933542233e-01,
           -2.79779981545119124951e-01, -4.91900132609500318020e-02, -4.06265923594885404393e-03,
           -1.59276496239262096340e-04, -2.77649108155232920844e-06, -1.67787698489114633780e-08)
_AI_AFD = (1.33560420706553243746e+01, 3.26825032795224613948e+01, 2.67367040941499554804e+01,
           9.18707402907259625840e+00, 1.47529146771666414581e+00, 1.15687173795188044134e-01,
           4.40291641615211203805e-03, 7.54720348287414296618e-05, 4.51850092970580378464e-07)
_AI_AGN = (1.97339932091685679179e-02, 3.91103029615688277255e-01, 1.06579897599595591108e+00,
           9.39169229816650230044e-01, 3.51465656105547619242e-01, 6.33888919628925490927e-02,
           5.85804113048388458567e-03, 2.82851600836737019778e-04, 6.98793669997260967291e-06,
           8.11789239554389293311e-08, 3.41551784765923618484e-10)
_AI_AGD = (9.30892908077441974853e+00, 1.98352928718312140417e+01, 1.55646628932864612953e+01,
           5.47686069422975497931e+00, 9.54293611618961883998e-01, 8.64580826352392193095e-02,
           4.12656523824222607191e-03, 1.01259085116509135510e-04, 1.17166733214413521882e-06,
           4.91834570062930015649e-09)
# CPU's power series (|x| < 2.09) runs until its term is below the dtype's epsilon; for |x| < 2.09 that is
# at most 11 iterations in float64 (measured: 9 in float32), so 16 fixed iterations, each element frozen
# once its own test fails, give CPU's values.
_AI_SERIES_STEPS = 16


@lowers(aten.special_airy_ai.default)
def _airy_ai(x: Any) -> Any:
    jax = _jax()
    jnp = jax.numpy
    x = _float(x)
    sqrt_pi_inv = 5.64189583547756286948e-01
    # x < -2.09: the asymptotic oscillating form (arguments clamped so the unused branch stays finite)
    xn = jnp.minimum(x, -2.09)
    zeta_n = -2.0 * xn * jnp.sqrt(-xn) / 3.0
    z = 1.0 / zeta_n
    zz = z * z
    afn, afd = _horner(zz, _AI_AFN), _horner(zz, _AI_AFD)
    agn, agd = _horner(zz, _AI_AGN), _horner(zz, _AI_AGD)
    t = zeta_n + 0.25 * math.pi
    neg = sqrt_pi_inv / jnp.sqrt(jnp.sqrt(-xn)) * (jnp.sin(t) * (1.0 + zz * afn / afd) - jnp.cos(t) * (z * agn / agd))
    # x >= 2.09: the asymptotic decaying form
    xp = jnp.maximum(x, 2.09)
    zeta = 2.0 * xp * jnp.sqrt(xp) / 3.0
    inv = 1.0 / zeta
    pos = sqrt_pi_inv * (_horner(inv, _AI_AN) / _horner(inv, _AI_AD)) / (2.0 * jnp.sqrt(jnp.sqrt(xp)) * jnp.exp(zeta))
    # otherwise the Maclaurin series of f and g
    xs = jnp.clip(x, -2.09, 2.09)
    z3 = xs * xs * xs
    eps = jnp.finfo(x.dtype).eps

    def step(_: Any, c: tuple[Any, ...]) -> tuple[Any, ...]:
        f, g, k, m, n, t = c
        live = t > eps
        m1 = m * z3
        k1 = k + 1.0
        m1 = m1 / k1
        n1 = n * z3
        k1 = k1 + 1.0
        n1 = n1 / k1
        m1 = m1 / k1
        f1 = f + m1
        k1 = k1 + 1.0
        n1 = n1 / k1
        g1 = g + n1
        t1 = jnp.abs(m1 / f1)
        pick = lambda new, old: jnp.where(live, new, old)  # noqa: E731
        return pick(f1, f), pick(g1, g), pick(k1, k), pick(m1, m), pick(n1, n), pick(t1, t)

    one = jnp.ones_like(xs)
    f, g, *_ = jax.lax.fori_loop(0, _AI_SERIES_STEPS, step, (one, xs, one, one, xs, one))
    series = 0.355028053887817239260 * f - 0.258819403792806798405 * g
    out = jnp.where(x < -2.09, neg, jnp.where(x >= 2.09, pos, series))
    out = jnp.where(x > 103.892, 0.0, out)
    return jnp.where(jnp.isinf(x), jnp.nan, out).astype(x.dtype)


_K0_A = (1.37446543561352307156e-16, 4.25981614279661018399e-14, 1.03496952576338420167e-11,
         1.90451637722020886025e-09, 2.53479107902614945675e-07, 2.28621210311945178607e-05,
         1.26461541144692592338e-03, 3.59799365153615016266e-02, 3.44289899924628486886e-01,
         -5.35327393233902768720e-01)
_K0_B = (5.30043377268626276149e-18, -1.64758043015242134646e-17, 5.21039150503902756861e-17,
         -1.67823109680541210385e-16, 5.51205597852431940784e-16, -1.84859337734377901440e-15,
         6.34007647740507060557e-15, -2.22751332699166985548e-14, 8.03289077536357521100e-14,
         -2.98009692317273043925e-13, 1.14034058820847496303e-12, -4.51459788337394416547e-12,
         1.85594911495471785253e-11, -7.95748924447710747776e-11, 3.57739728140030116597e-10,
         -1.69753450938905987466e-09, 8.57403401741422608519e-09, -4.66048989768794782956e-08,
         2.76681363944501510342e-07, -1.83175552271911948767e-06, 1.39498137188764993662e-05,
         -1.28495495816278026384e-04, 1.56988388573005337491e-03, -3.14481013119645005427e-02,
         2.44030308206595545468e+00)
_K1_A = (-7.02386347938628759343e-18, -2.42744985051936593393e-15, -6.66690169419932900609e-13,
         -1.41148839263352776110e-10, -2.21338763073472585583e-08, -2.43340614156596823496e-06,
         -1.73028895751305206302e-04, -6.97572385963986435018e-03, -1.22611180822657148235e-01,
         -3.53155960776544875667e-01, 1.52530022733894777053e+00)
_K1_B = (-5.75674448366501715755e-18, 1.79405087314755922667e-17, -5.68946255844285935196e-17,
         1.83809354436663880070e-16, -6.05704724837331885336e-16, 2.03870316562433424052e-15,
         -7.01983709041831346144e-15, 2.47715442448130437068e-14, -8.97670518232499435011e-14,
         3.34841966607842919884e-13, -1.28917396095102890680e-12, 5.13963967348173025100e-12,
         -2.12996783842756842877e-11, 9.21831518760500529508e-11, -4.19035475934189648750e-10,
         2.01504975519703286596e-09, -1.03457624656780970260e-08, 5.74108412545004946722e-08,
         -3.50196060308781257119e-07, 2.40648494783721712015e-06, -1.93619797416608296024e-05,
         1.95215518471351631108e-04, -2.85781685962277938680e-03, 1.03923736576817238437e-01,
         2.72062619048444266945e+00)


def _scaled_k(order: int) -> Any:
    """exp(x) K_order(x): a Chebyshev series in x^2 - 2 on (0, 2] (with log(x/2) I_order(x), JAX's Bessel I),
    one in 8/x - 2 above; inf at 0, NaN below."""

    def fn(x: Any) -> Any:
        jax = _jax()
        jnp = jax.numpy
        x = _float(x)
        xs = jnp.clip(x, 1e-30, 2.0)  # the small branch, kept finite where it is not used
        a = _chbevl(xs * xs - 2.0, _K0_A if order == 0 else _K1_A)
        i = jax.scipy.special.i0(xs) if order == 0 else jax.scipy.special.i1(xs)
        small = (a - jnp.log(0.5 * xs) * i if order == 0 else jnp.log(0.5 * xs) * i + a / xs) * jnp.exp(xs)
        xl = jnp.maximum(x, 2.0)
        large = _chbevl(8.0 / xl - 2.0, _K0_B if order == 0 else _K1_B) / jnp.sqrt(xl)
        out = jnp.where(x <= 2.0, small, large)
        out = jnp.where(x == 0, jnp.inf, jnp.where(x < 0, jnp.nan, out))
        return out.astype(x.dtype)

    return fn


lowers(aten.special_scaled_modified_bessel_k0.default)(_scaled_k(0))
lowers(aten.special_scaled_modified_bessel_k1.default)(_scaled_k(1))


@lowers(aten.special_spherical_bessel_j0.default)
def _spherical_bessel_j0(x: Any) -> Any:
    """sin(x)/x, by its Taylor polynomial for |x| < 0.5 (CPU's), 0 at +-inf."""
    jnp = _jax().numpy
    x = _float(x)
    xx = x * x
    poly = 1.0 + xx * (-1.0 / 6.0 + xx * (1.0 / 120.0 + xx * (-1.0 / 5040.0 + xx * (
        1.0 / 362880.0 + xx * (-1.0 / 39916800.0 + xx * (1.0 / 6227020800.0))))))
    safe = jnp.where(jnp.abs(x) < 0.5, 1.0, x)
    out = jnp.where(jnp.abs(x) < 0.5, poly, jnp.sin(safe) / safe)
    return jnp.where(jnp.isinf(x), 0.0, out).astype(x.dtype)


@lowers(aten.special_zeta.default)
def _zeta(x: Any, q: Any) -> Any:
    """Hurwitz zeta: torchax's (jax.scipy.special.zeta), with the domain of CPU's Cephes kernel, whose checks run
    in this order: x == 1 is inf, x < 1 NaN (JAX gave inf at x = 0, q = 0: the OpInfo bool samples), then a
    non-positive integer q is inf (JAX: NaN for a non-integer x)."""
    from hf_tpu.torchax_compat import load_op_table

    jnp = _jax().numpy
    table = load_op_table()[0]
    out = (table.get(aten.special_zeta.default) or table[aten.special_zeta]).func(x, q)
    xa, qa = jnp.asarray(x), jnp.asarray(q)
    inf, nan = jnp.asarray(jnp.inf, out.dtype), jnp.asarray(jnp.nan, out.dtype)
    out = jnp.where((qa <= 0) & (qa == jnp.floor(qa)), inf, out)
    return jnp.where(xa == 1, inf, jnp.where(xa < 1, nan, out))

#!/usr/bin/env python3
"""fit_erfcx.py: the coefficients of lm_erfcx in kernels/cpu/fastmath.h.

erfcx(t) = erfc(t) e^(t^2) on [0, 9.5] as P(t) / Q(t), degrees 4 and 5,
Q(0) = 1, fitted for relative error: linearised least squares reweighted by
the last Q (Sanathanan-Koerner), then by the error (Lawson), which tends to
the minimax fit. Prints the fit's error in exact arithmetic and the lines to
paste. Needs numpy; nothing in loom runs it.
    python3 scripts/fit_erfcx.py [m n]
"""
import math
import sys

import numpy as np
from numpy.polynomial import chebyshev as C
from numpy.polynomial import polynomial as P

M, N = (int(a) for a in sys.argv[1:3]) if len(sys.argv) > 2 else (4, 5)
B = 9.5
K = 6000
t = np.sort(B / 2 + B / 2 * np.cos(np.pi * (np.arange(K) + 0.5) / K))
f = np.array([math.exp(v * v) * math.erfc(v) for v in t])
s = 2 * t / B - 1  # Chebyshev basis in s for a well-conditioned solve
Vp, Vq = C.chebvander(s, M), C.chebvander(s, N)

w, q_last, best = np.ones(K), np.ones(K), (np.inf, None, None)
for it in range(60):
    scale = (f * q_last)[:, None] / np.sqrt(w)[:, None]
    A = np.hstack([Vp, -f[:, None] * Vq[:, 1:]]) / scale
    sol = np.linalg.lstsq(A, f * Vq[:, 0] / scale[:, 0], rcond=None)[0]
    pc, qc = sol[: M + 1], np.concatenate([[1.0], sol[M + 1:]])
    q_last = Vq @ qc
    err = (Vp @ pc / q_last - f) / f
    if np.abs(err).max() < best[0]:
        best = (np.abs(err).max(), pc, qc)
    if it >= 20:
        w = w * np.abs(err)
        w /= w.sum()


def monomial(c):  # Chebyshev series in s = 2 t / B - 1 -> powers of t
    out = np.zeros(1)
    for a in reversed(C.cheb2poly(c)):
        out = P.polyadd(P.polymul(out, [-1.0, 2 / B]), [a])
    return out


e, pc, qc = best
pm, qm = monomial(pc), monomial(qc)
pm, qm = pm / qm[0], qm / qm[0]
print(f"relative error {e:.3g} on [0, {B}]")
for name, c in (("p", pm), ("q", qm)):
    print(f"  float {name} = {float(c[-1])!r}f;")
    for a in reversed(c[:-1]):
        print(f"  {name} = {name} * tc + {float(a)!r}f;")

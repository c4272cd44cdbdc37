/* unary.h: the unary pointwise kinds (enum lm_unary) and their math, written
 * once: each kind's f(x) and f'(x) as scalar expressions of x, y = f(x) and
 * the parameters k0, k1, in the precision lm_real of the evaluation. Every
 * backend evaluates these expressions (kernels/unary_math.h makes functions
 * of them for the CPU, CUDA and the emulator); the CPU's vectorised f32
 * kernels (kernels/cpu/fastmath.h) stand in for a few kinds and are tested
 * against them (spec/c/test_unary_math.c). A kind with new math is one line
 * of the list below. */
#ifndef LOOM_UNARY_H
#define LOOM_UNARY_H

/* what f'(x) reads: nothing (not differentiable), x, or y = f(x) too */
enum lm_unary_grad { LM_D_NONE, LM_D_X, LM_D_Y };

#define LM_R(v) ((lm_real)(v))
/* gelu(x) = x Phi(x); gelu'(x) = Phi(x) + x phi(x) */
#define LM_GELU_OF(x) ((x) * LM_R(0.5) * erfc(-(x) * LM_R(0.70710678118654752440)))
#define LM_GELU_D_OF(x)                                                        \
  (LM_R(0.5) * erfc(-(x) * LM_R(0.70710678118654752440)) +                     \
   (x) * exp(-(x) * (x) / 2) * LM_R(0.39894228040143267794))
/* tanh-approximated gelu: 0.5 x (1 + tanh z) = x sigmoid(2z), z = k (x + c x^3) */
#define LM_GELU_TANH_Z2(x) (2 * LM_R(0.79788456080286535588) * ((x) + LM_R(0.044715) * (x) * (x) * (x)))
#define LM_GELU_TANH_OF(x) ((x) / (1 + exp(-LM_GELU_TANH_Z2(x))))
#define LM_GELU_TANH_D_OF(x)                                                   \
  (LM_R(0.5) * (1 + tanh(LM_GELU_TANH_Z2(x) / 2)) +                            \
   LM_R(0.5) * (x) * (1 - tanh(LM_GELU_TANH_Z2(x) / 2) * tanh(LM_GELU_TANH_Z2(x) / 2)) * \
       LM_R(0.79788456080286535588) * (1 + 3 * LM_R(0.044715) * (x) * (x)))
/* silu(x) = x s, s = sigmoid(x); silu'(x) = s (1 + x (1 - s)) */
#define LM_SILU_D_OF(x) ((1 + (x) * (1 - 1 / (1 + exp(-(x))))) / (1 + exp(-(x))))
/* mish(x) = x t, t = tanh(softplus(x)); mish'(x) = t + x (1 - t^2) sigmoid(x) */
#define LM_MISH_T(x) tanh(log1p(exp(x)))

/*      kind          f(x)                                  f'(x)                          reads */
#define LM_UNARY_KINDS(X)                                                                       \
  X(NEG,          -x,                                   -1,                            LM_D_X)  \
  X(ABS,          fabs(x),                              (x > 0) - (x < 0),             LM_D_X)  \
  X(SQRT,         sqrt(x),                              1 / (y * 2),                   LM_D_Y)  \
  X(RSQRT,        1 / sqrt(x),                          y * y * y * LM_R(-0.5),        LM_D_Y)  \
  X(EXP,          exp(x),                               y,                             LM_D_Y)  \
  X(LOG,          log(x),                               1 / x,                         LM_D_X)  \
  X(TANH,         tanh(x),                              1 - y * y,                     LM_D_Y)  \
  X(SIGMOID,      1 / (1 + exp(-x)),                    y * (1 - y),                   LM_D_Y)  \
  X(RELU,         x > 0 ? x : 0,                        x > 0,                         LM_D_X)  \
  X(GELU,         LM_GELU_OF(x),                        LM_GELU_D_OF(x),               LM_D_X)  \
  X(GELU_TANH,    LM_GELU_TANH_OF(x),                   LM_GELU_TANH_D_OF(x),          LM_D_X)  \
  X(SILU,         x / (1 + exp(-x)),                    LM_SILU_D_OF(x),               LM_D_X)  \
  X(SIN,          sin(x),                               cos(x),                        LM_D_X)  \
  X(COS,          cos(x),                               -sin(x),                       LM_D_X)  \
  X(POW_SCALAR,   k0 == 2 ? x * x : pow(x, k0),         k0 * pow(x, k0 - 1),           LM_D_X)  \
  /* clamp's gradient is 1 strictly inside (k0, k1), 0 at a bound (PyTorch's) */                \
  X(CLAMP,        x < k0 ? k0 : x > k1 ? k1 : x,        x > k0 && x < k1,              LM_D_X)  \
  /* softplus(x) = log(1 + e^(k1 x)) / k1, linear where k1 x > k0 (PyTorch's beta k1, threshold k0) */ \
  X(SOFTPLUS,     k1 * x > k0 ? x : log1p(exp(k1 * x)) / k1, k1 * x > k0 ? 1 : 1 / (1 + exp(-k1 * x)), LM_D_X) \
  X(MISH,         x * LM_MISH_T(x),  LM_MISH_T(x) + x * (1 - LM_MISH_T(x) * LM_MISH_T(x)) / (1 + exp(-x)), LM_D_X) \
  /* a Lua number as an operand (x + 1, x * 0.5, x / 4, 2 - x): no 0-dim tensor per call */          \
  X(ADD_SCALAR,   x + k0,                               1,                             LM_D_X)  \
  X(MUL_SCALAR,   x * k0,                               k0,                            LM_D_X)  \
  X(DIV_SCALAR,   x / k0,                               1 / k0,                        LM_D_X)  \
  X(RSUB_SCALAR,  k0 - x,                               -1,                            LM_D_X)  \
  X(NOT,          x == 0,                               0,                             LM_D_NONE) \
  X(SIGN,         (x > 0) - (x < 0),                    0,                             LM_D_NONE) \
  /* derivatives as kinds of their own, for composed backward passes */                        \
  X(GELU_D,       LM_GELU_D_OF(x),                      0,                             LM_D_NONE) \
  X(GELU_TANH_D,  LM_GELU_TANH_D_OF(x),                 0,                             LM_D_NONE) \
  X(SILU_D,       LM_SILU_D_OF(x),                      0,                             LM_D_NONE)

#define LM_UNARY_ENUM_(K, F, D, R) LM_##K,
enum lm_unary { LM_UNARY_KINDS(LM_UNARY_ENUM_) LM_NUNARY };
#undef LM_UNARY_ENUM_

#endif

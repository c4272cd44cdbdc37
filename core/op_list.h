/* op_list.h: every op of loom, one line each. This list is the single
 * definition the op table (ops/op_table.c), the op ids (enum lm_op_id in
 * loom.h) and Lua's constants (C.LM_OP_<ID>) are made from.
 *
 * Columns: ID, name; tensor inputs (-1: any number) and outputs; the
 * backend kernel kind (enum lm_unary, lm_binary or lm_reduce, else 0);
 * flags (LM_OPF_*, see ops/op.h: NOSAVE when its backward reads no saved
 * values, AMP_LOW/AMP_F32 for what autocast runs in bf16/f16 or in f32); the functions, named by suffix: lm_shape_<shape>
 * (shape and dtype inference, also used by the sharding rule), lm_fw_<fw>
 * (forward), lm_bw_<bw> (backward, none: not differentiable) and
 * lm_rule_<rule> (sharding rule, none: not on DTensors); last the backend
 * slot the forward calls (none: built from other ops). Adding an op is one
 * line here plus its kernel; see docs/architecture.md. */
/*    ID                   name                          nin nout kind            flags                         shape          fw                   bw                   rule           slot */
/* shapes and copies (ops/view.c) */
LM_OP(VIEW,                view,                         1,  1, 0,              LM_OPF_NOSAVE,                view,          view,                reshape,             view,          none)
LM_OP(RESHAPE,             reshape,                      1,  1, 0,              LM_OPF_NOSAVE,                view,          reshape,             reshape,             view,          copy)
LM_OP(TRANSPOSE,           transpose,                    1,  1, 0,              LM_OPF_NOSAVE,                transpose,     transpose,           transpose,           transpose,     none)
LM_OP(PERMUTE,             permute,                      1,  1, 0,              LM_OPF_NOSAVE,                permute,       permute,             permute,             permute,       none)
LM_OP(NARROW,              narrow,                       1,  1, 0,              LM_OPF_NOSAVE,                narrow,        narrow,              narrow,              narrow,        none)
LM_OP(EXPAND,              expand,                       1,  1, 0,              LM_OPF_NOSAVE,                expand,        expand,              identity,            expand,        none)
LM_OP(CONTIGUOUS,          contiguous,                   1,  1, 0,              LM_OPF_NOSAVE,                same,          contiguous,          identity,            linear_pw,     copy)
LM_OP(CLONE,               clone,                        1,  1, 0,              LM_OPF_NOSAVE,                same,          clone,               identity,            linear_pw,     copy)
LM_OP(TO,                  to,                           1,  1, 0,              LM_OPF_NOSAVE,                to,            to,                  identity,            linear_pw,     copy)
LM_OP(TO_DEVICE,           to_device,                    1,  1, 0,              LM_OPF_NOSAVE|LM_OPF_META_FW, same,          to_device,           to_device,           none,          copy)
LM_OP(UNSQUEEZE,           unsqueeze,                    1,  1, 0,              LM_OPF_NOSAVE,                unsqueeze,     unsqueeze,           reshape,             unsqueeze,     none)
LM_OP(SQUEEZE,             squeeze,                      1,  1, 0,              LM_OPF_NOSAVE,                squeeze,       squeeze,             reshape,             squeeze,       none)
LM_OP(CAT,                 cat,                          -1, 1, 0,              LM_OPF_NOSAVE,                cat,           cat,                 cat,                 cat,           copy)
/* elementwise (ops/pointwise.c) */
LM_OP(ADD,                 add,                          2,  1, LM_ADD,         LM_OPF_NOSAVE,                binary,        binary,              binary,              linear_pw,     binary)
LM_OP(SUB,                 sub,                          2,  1, LM_SUB,         LM_OPF_NOSAVE,                binary,        binary,              binary,              linear_pw,     binary)
LM_OP(MUL,                 mul,                          2,  1, LM_MUL,         0,                            binary,        binary,              binary,              mul,           binary)
LM_OP(DIV,                 div,                          2,  1, LM_DIV,         0,                            binary,        binary,              binary,              mul,           binary)
LM_OP(POW,                 pow,                          2,  1, LM_POW,         0,                            binary,        binary,              binary,              pointwise,     binary)
LM_OP(MAXIMUM,             maximum,                      2,  1, LM_MAXIMUM,     0,                            binary,        binary,              binary,              pointwise,     binary)
LM_OP(MINIMUM,             minimum,                      2,  1, LM_MINIMUM,     0,                            binary,        binary,              binary,              pointwise,     binary)
LM_OP(EQ,                  eq,                           2,  1, LM_EQ,          0,                            binary,        binary,              none,                pointwise,     binary)
LM_OP(NE,                  ne,                           2,  1, LM_NE,          0,                            binary,        binary,              none,                pointwise,     binary)
LM_OP(LT,                  lt,                           2,  1, LM_LT,          0,                            binary,        binary,              none,                pointwise,     binary)
LM_OP(LE,                  le,                           2,  1, LM_LE,          0,                            binary,        binary,              none,                pointwise,     binary)
LM_OP(GT,                  gt,                           2,  1, LM_GT,          0,                            binary,        binary,              none,                pointwise,     binary)
LM_OP(GE,                  ge,                           2,  1, LM_GE,          0,                            binary,        binary,              none,                pointwise,     binary)
LM_OP(LOGICAL_AND,         logical_and,                  2,  1, LM_AND,         0,                            binary,        binary,              none,                pointwise,     binary)
LM_OP(LOGICAL_OR,          logical_or,                   2,  1, LM_OR,          0,                            binary,        binary,              none,                pointwise,     binary)
LM_OP(NEG,                 neg,                          1,  1, LM_NEG,         LM_OPF_NOSAVE,                unary,         unary,               unary,               linear_pw,     unary)
LM_OP(ABS,                 abs,                          1,  1, LM_ABS,         0,                            unary,         unary,               unary,               pointwise,     unary)
LM_OP(SQRT,                sqrt,                         1,  1, LM_SQRT,        0,                            unary,         unary,               unary,               pointwise,     unary)
LM_OP(RSQRT,               rsqrt,                        1,  1, LM_RSQRT,       0,                            unary,         unary,               unary,               pointwise,     unary)
LM_OP(EXP,                 exp,                          1,  1, LM_EXP,         0,                            unary,         unary,               unary,               pointwise,     unary)
LM_OP(LOG,                 log,                          1,  1, LM_LOG,         0,                            unary,         unary,               unary,               pointwise,     unary)
LM_OP(TANH,                tanh,                         1,  1, LM_TANH,        0,                            unary,         unary,               unary,               pointwise,     unary)
LM_OP(SIGMOID,             sigmoid,                      1,  1, LM_SIGMOID,     0,                            unary,         unary,               unary,               pointwise,     unary)
LM_OP(RELU,                relu,                         1,  1, LM_RELU,        0,                            unary,         unary,               unary,               pointwise,     unary)
LM_OP(GELU,                gelu,                         1,  1, LM_GELU,        0,                            unary,         unary,               unary,               pointwise,     unary)
LM_OP(GELU_TANH,           gelu_tanh,                    1,  1, LM_GELU_TANH,   0,                            unary,         unary,               unary,               pointwise,     unary)
LM_OP(SILU,                silu,                         1,  1, LM_SILU,        0,                            unary,         unary,               unary,               pointwise,     unary)
LM_OP(SIN,                 sin,                          1,  1, LM_SIN,         0,                            unary,         unary,               unary,               pointwise,     unary)
LM_OP(COS,                 cos,                          1,  1, LM_COS,         0,                            unary,         unary,               unary,               pointwise,     unary)
LM_OP(POW_SCALAR,          pow_scalar,                   1,  1, LM_POW_SCALAR,  0,                            unary,         unary,               unary,               pointwise,     unary)
LM_OP(CLAMP,               clamp,                        1,  1, LM_CLAMP,       0,                            unary,         unary,               unary,               pointwise,     unary)
LM_OP(SOFTPLUS,            softplus,                     1,  1, LM_SOFTPLUS,    0,                            unary,         unary,               unary,               pointwise,     unary)
LM_OP(MISH,                mish,                         1,  1, LM_MISH,        0,                            unary,         unary,               unary,               pointwise,     unary)
LM_OP(HARDTANH,            hardtanh,                     1,  1, LM_CLAMP,       0,                            unary,         unary,               unary,               pointwise,     unary)
LM_OP(ADD_SCALAR,          add_scalar,                   1,  1, LM_ADD_SCALAR,  0,                            unary,         unary,               unary,               pointwise,     unary)
LM_OP(MUL_SCALAR,          mul_scalar,                   1,  1, LM_MUL_SCALAR,  0,                            unary,         unary,               unary,               pointwise,     unary)
LM_OP(DIV_SCALAR,          div_scalar,                   1,  1, LM_DIV_SCALAR,  0,                            unary,         unary,               unary,               pointwise,     unary)
LM_OP(RSUB_SCALAR,         rsub_scalar,                  1,  1, LM_RSUB_SCALAR, 0,                            unary,         unary,               unary,               pointwise,     unary)
LM_OP(LOGICAL_NOT,         logical_not,                  1,  1, LM_NOT,         0,                            unary,         unary,               none,                pointwise,     unary)
LM_OP(SIGN,                sign,                         1,  1, LM_SIGN,        0,                            unary,         unary,               none,                pointwise,     unary)
LM_OP(GELU_D,              _gelu_d,                      1,  1, LM_GELU_D,      0,                            unary,         unary,               none,                none,          unary)
LM_OP(GELU_TANH_D,         _gelu_tanh_d,                 1,  1, LM_GELU_TANH_D, 0,                            unary,         unary,               none,                none,          unary)
LM_OP(SILU_D,              _silu_d,                      1,  1, LM_SILU_D,      0,                            unary,         unary,               none,                none,          unary)
LM_OP(SWIGLU,              swiglu,                       2,  1, 0,              0,                            swiglu,        swiglu,              swiglu,              pointwise,     none)
LM_OP(WHERE,               where,                        3,  1, 0,              0,                            where,         where,               where,               pointwise,     where)
/* reductions (ops/reduce.c) */
LM_OP(SUM,                 sum,                          1,  1, LM_SUM,         LM_OPF_NOSAVE,                reduce,        sum,                 sum,                 reduce,        reduce)
LM_OP(MEAN,                mean,                         1,  1, LM_SUM,         LM_OPF_NOSAVE,                reduce,        mean,                mean,                reduce,        reduce)
LM_OP(MAX,                 max,                          1,  2, LM_MAX,         0,                            reduce,        minmax,              minmax,              reduce,        reduce)
LM_OP(MIN,                 min,                          1,  2, LM_MIN,         0,                            reduce,        minmax,              minmax,              reduce,        reduce)
LM_OP(ARGMAX,              argmax,                       1,  1, LM_ARGMAX,      0,                            reduce,        arg,                 none,                reduce,        reduce)
LM_OP(ARGMIN,              argmin,                       1,  1, LM_ARGMIN,      0,                            reduce,        arg,                 none,                reduce,        reduce)
/* linear algebra (ops/linalg.c; grouped_mm: ops/grouped_mm.c) */
LM_OP(MATMUL,              matmul,                       2,  1, 0,              LM_OPF_AMP_LOW,               matmul,        matmul,              matmul,              matmul,        gemm)
LM_OP(GROUPED_MM,          grouped_mm,                   3,  1, 0,              LM_OPF_AMP_LOW,               grouped_mm,    grouped_mm,          grouped_mm,          none,          grouped_gemm)
/* neural-network ops: ops/softmax.c, norm.c, embedding.c, cross_entropy.c, triangular.c, attention.c */
LM_OP(SOFTMAX,             softmax,                      1,  1, 0,              LM_OPF_AMP_F32,               softmax,       softmax,             softmax,             rows,          softmax)
LM_OP(LOG_SOFTMAX,         log_softmax,                  1,  1, 0,              LM_OPF_AMP_F32,               softmax,       softmax,             softmax,             rows,          softmax)
LM_OP(LAYER_NORM,          layer_norm,                   -1, 2, 0,              LM_OPF_AMP_F32,               norm,          norm,                norm,                rows,          norm)
LM_OP(RMS_NORM,            rms_norm,                     -1, 2, 0,              LM_OPF_AMP_F32,               norm,          norm,                norm,                rows,          norm)
LM_OP(EMBEDDING,           embedding,                    2,  1, 0,              0,                            embedding,     embedding,           embedding,           embedding,     embedding)
LM_OP(CROSS_ENTROPY,       cross_entropy,                -1, 2, 0,              LM_OPF_AMP_F32,               cross_entropy, cross_entropy,       cross_entropy,       cross_entropy, index_add)
LM_OP(TRIU,                triu,                         1,  1, 0,              LM_OPF_NOSAVE,                tri,           tri,                 tri,                 last2,         none)
LM_OP(TRIL,                tril,                         1,  1, 0,              LM_OPF_NOSAVE,                tri,           tri,                 tri,                 last2,         none)
LM_OP(SDPA,                scaled_dot_product_attention, -1, 2, 0,              LM_OPF_AMP_LOW,               sdpa,          sdpa,                sdpa,                sdpa,          none)
LM_OP(ROPE,                rope,                         3,  1, 0,              0,                            rope,          rope,                rope,                rope,          none)
/* optimizer updates in place (ops/optim.c) */
LM_OP(ADAMW,               _adamw_,                      4,  0, 0,              LM_OPF_INPLACE,               adamw,         adamw,               none,                local,         adamw)
LM_OP(ADAMW_MULTI,         _adamw_multi_,                -1, 0, 0,              LM_OPF_INPLACE,               adamw_multi,   adamw_multi,         none,                none,          adamw)
/* collectives as differentiable ops on shards (ops/collective.c) */
LM_OP(DIST_ALL_GATHER,     _dist_all_gather,             1,  1, 0,              LM_OPF_NATIVE|LM_OPF_NOSAVE,  none,          dist_all_gather,     dist_all_gather,     none,          none)
LM_OP(DIST_SLICE,          _dist_slice,                  1,  1, 0,              LM_OPF_NATIVE|LM_OPF_NOSAVE,  none,          dist_slice,          dist_slice,          none,          none)
LM_OP(DIST_ALL_REDUCE,     _dist_all_reduce,             1,  1, 0,              LM_OPF_NATIVE|LM_OPF_NOSAVE,  none,          dist_all_reduce,     dist_all_reduce,     none,          none)
LM_OP(DIST_REDUCE_SCATTER, _dist_reduce_scatter,         1,  1, 0,              LM_OPF_NATIVE|LM_OPF_NOSAVE,  none,          dist_reduce_scatter, dist_reduce_scatter, none,          none)
LM_OP(DIST_ALL_TO_ALL,     _dist_all_to_all,             1,  1, 0,              LM_OPF_NATIVE|LM_OPF_NOSAVE,  none,          dist_all_to_all,     dist_all_to_all,     none,          none)
LM_OP(DIST_TO_PARTIAL,     _dist_to_partial,             1,  1, 0,              LM_OPF_NATIVE|LM_OPF_NOSAVE,  same,          dist_to_partial,     identity,            none,          none)
LM_OP(DIST_GRAD_REDUCE,    _dist_grad_reduce,            1,  1, 0,              LM_OPF_NATIVE|LM_OPF_NOSAVE,  same,          dist_alias,          dist_grad_reduce,    none,          none)
LM_OP(DIST_ALIAS,          _dist_alias,                  1,  1, 0,              LM_OPF_NATIVE|LM_OPF_NOSAVE,  same,          dist_alias,          identity,            none,          none)
LM_OP(DIST_PAD,            _dist_pad,                    1,  1, 0,              LM_OPF_NATIVE|LM_OPF_NOSAVE,  none,          dist_pad,            dist_pad,            none,          none)
LM_OP(DIST_ALL_TO_ALL_SINGLE, _dist_all_to_all_single,     3,  1, 0,              LM_OPF_NATIVE,                none,          dist_all_to_all_single, dist_all_to_all_single, none,     none)

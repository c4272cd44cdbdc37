/* op_table.c: the op table, one entry per line of op_list.h: name, arity,
 * kernel kind, flags, kernel slot and the shape, forward and backward
 * functions (the sharding rules are dtensor/'s column of the same list).
 * It names every op's functions and calls none. */
#include "op.h"
#include <stddef.h>

/* A list entry names its functions by suffix; "none" is no function. */
#define lm_shape_none NULL
#define lm_bw_none NULL
/* ... and its kernel by the lm_backend slot's name. */
#define SLOT(x) offsetof(lm_backend, x)
#define LM_SLOT_none 0
#define LM_SLOT_copy SLOT(copy)
#define LM_SLOT_unary SLOT(unary)
#define LM_SLOT_binary SLOT(binary)
#define LM_SLOT_where SLOT(where)
#define LM_SLOT_reduce SLOT(reduce)
#define LM_SLOT_gemm SLOT(gemm)
#define LM_SLOT_grouped_gemm SLOT(grouped_gemm)
#define LM_SLOT_softmax SLOT(softmax)
#define LM_SLOT_norm SLOT(norm)
#define LM_SLOT_embedding SLOT(embedding)
#define LM_SLOT_index_add SLOT(index_add)
#define LM_SLOT_adamw SLOT(adamw)

const lm_op_def lm_op_table[LM_NOPS] = {
#define LM_OP(ID, NAME, NIN, NOUT, KIND, FLAGS, SHAPE, FW, BW, RULE, SLOT_)                   \
  [LM_OP_##ID] = {#NAME, NIN, NOUT, KIND, FLAGS, LM_SLOT_##SLOT_, lm_shape_##SHAPE, lm_fw_##FW, \
                  lm_bw_##BW},
#include "../op_list.h"
#undef LM_OP
};


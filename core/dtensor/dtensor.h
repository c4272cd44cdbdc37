/* dtensor.h: the DTensor layer, above autograd: device meshes, DTensor
 * specs and redistribution (dtensor.c), sharding rules (rules.c), and ops
 * on DTensors: rule, redistribution, the op on the shards (dispatch.c).
 * The op entry (entry/) sends calls with DTensor arguments here. */
#ifndef LOOM_DTENSOR_H
#define LOOM_DTENSOR_H
#include "../autograd/autograd.h"


struct lm_mesh {
  int32_t refcount;
  int ndim, device;
  int64_t shape[LM_MAX_MESH], coord[LM_MAX_MESH];
  lm_comm *comm[LM_MAX_MESH];
};

/* The spec a DTensor's `dist` points to (each tensor owns its copy). */
typedef struct lm_dspec {
  lm_part part;
  lm_mesh *mesh;                     /* retained by a tensor's spec */
  int nd;                            /* global ndim */
  int64_t shape[LM_MAX_DIMS];        /* global shape */
  lm_placement pl[LM_MAX_MESH];
} lm_dspec;
static inline const lm_dspec *lm_spec(const lm_tensor *t) { return (const lm_dspec *)t->dist; }
int lm_attach_spec(lm_tensor *t, const lm_dspec *s);  /* copies s into t->dist */

/* A sharding rule sees the input specs (global shapes, placements) and the
 * op's attrs; out[] arrive with the global shapes shape inference gave and
 * every placement Replicate. It writes the placements each input must have
 * before the shard-local op runs (want starts as the inputs' own), attrs
 * for the local op (local starts as a copy), and the outputs' placements.
 * Rules decide each mesh dim on its own, as PyTorch's single-dim
 * strategies do. */
#define LM_RULE_MAX_IN 8
typedef struct lm_rule {
  int op, nin, nout;
  const lm_dspec *in[LM_RULE_MAX_IN];
  const lm_attrs *a;
  lm_attrs local;
  lm_placement want[LM_RULE_MAX_IN][LM_MAX_MESH];
  lm_dspec out[LM_MAX_OUT];
} lm_rule;

/* Each op's sharding rule, the rule column of op_list.h (rules.c); NULL:
 * the op does not take DTensors. */
typedef int (*lm_rule_fn)(lm_rule *r);
extern const lm_rule_fn lm_rule_table[LM_NOPS];
#define LM_OP(ID, NAME, NIN, NOUT, KIND, FLAGS, SHAPE, FW, BW, RULE, SLOT) int lm_rule_##RULE(lm_rule *r);
#include "../op_list.h"
#undef LM_OP

/* Runs op on DTensor inputs (dispatch.c): rule, redistribution, the op on
 * the shards (recorded by autograd), specs on the outputs. */
int lm_dtensor_call(int op, int nin, lm_tensor *const *in, const lm_attrs *a, lm_tensor **out);
int lm_implicit_replication(void);

#endif

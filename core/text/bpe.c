/* bpe.c: the byte-pair-encoding merge loop of Hugging Face's BPE model,
 * for one pre-tokenized piece at a time. Ids here are 0-based (the ids of
 * tokenizer.json); the Lua layer (loom.tokenizer) adds one.
 *
 * A piece starts as one symbol per byte (byte-level BPE: GPT-2, Llama 3) or
 * per UTF-8 character (SentencePiece style, with byte fallback: Llama 2),
 * then the pair of neighbours with the lowest merge rank is merged, the
 * leftmost first among equals, until no pair has a merge: the same order as
 * tokenizers' word.rs (a min-heap of (rank, position), stale entries
 * skipped), so the ids are the same. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../tensor/tensor.h"   /* lm_error, lm_fnv1a */

typedef struct { uint64_t key; int32_t rank, merged; } pair_slot;   /* key 0: empty */
typedef struct { uint32_t off, len; int32_t id; } str_slot;            /* id -1: empty */

struct lm_bpe {
  pair_slot *pairs; size_t pair_cap, n_pairs;
  str_slot *strs; size_t str_cap, n_strs;
  char *arena; size_t arena_len, arena_cap;
  int32_t n_vocab, byte_level, ignore_merges, unk_id, fuse_unk;
  int32_t byte_ids[256];    /* byte fallback: the id of <0xXX>, -1 if none */
};

static uint64_t hash_bytes(const char *p, size_t n) { return lm_fnv1a(p, n, 0); }
static uint64_t mix(uint64_t k) { k ^= k >> 33; k *= 0xff51afd7ed558ccdULL; k ^= k >> 33; return k; }

lm_bpe *lm_bpe_new(int32_t n_vocab) {
  if (n_vocab < 1 || n_vocab > LM_BPE_MAX_VOCAB) { lm_error("lm_bpe_new: vocabulary size out of range"); return NULL; }
  lm_bpe *b = calloc(1, sizeof *b);
  if (!b) return NULL;
  b->n_vocab = n_vocab;
  b->unk_id = -1;
  for (int i = 0; i < 256; i++) b->byte_ids[i] = -1;
  size_t cap = 1024;   /* both tables grow with their entries, not with the largest id */
  b->str_cap = cap;
  b->strs = malloc(cap * sizeof *b->strs);
  b->pair_cap = cap;
  b->pairs = calloc(cap, sizeof *b->pairs);
  if (!b->strs || !b->pairs) { lm_bpe_free(b); return NULL; }
  for (size_t i = 0; i < cap; i++) b->strs[i].id = -1;
  return b;
}

void lm_bpe_free(lm_bpe *b) {
  if (!b) return;
  free(b->pairs); free(b->strs); free(b->arena); free(b);
}

static int32_t find_str(const lm_bpe *b, const char *p, size_t n) {
  size_t mask = b->str_cap - 1;
  for (size_t i = hash_bytes(p, n) & mask;; i = (i + 1) & mask) {
    const str_slot *s = &b->strs[i];
    if (s->id < 0) return -1;
    if (s->len == n && memcmp(b->arena + s->off, p, n) == 0) return s->id;
  }
}

static int grow_strs(lm_bpe *b) {
  size_t cap = b->str_cap * 2;
  str_slot *t = malloc(cap * sizeof *t);
  if (!t) return lm_error("lm_bpe_add_token: out of memory");
  for (size_t i = 0; i < cap; i++) t[i].id = -1;
  for (size_t i = 0; i < b->str_cap; i++) {
    str_slot s = b->strs[i];
    if (s.id < 0) continue;
    size_t j = hash_bytes(b->arena + s.off, s.len) & (cap - 1);
    while (t[j].id >= 0) j = (j + 1) & (cap - 1);
    t[j] = s;
  }
  free(b->strs);
  b->strs = t;
  b->str_cap = cap;
  return 0;
}

int lm_bpe_add_token(lm_bpe *b, const char *bytes, size_t len, int32_t id) {
  if (id < 0 || id >= b->n_vocab) { lm_error("lm_bpe_add_token: id out of range"); return -1; }
  if (len == 0 || len > LM_BPE_MAX_TOKEN_BYTES) { lm_error("lm_bpe_add_token: token length out of range"); return -1; }
  if (b->n_strs >= (size_t)b->n_vocab) { lm_error("lm_bpe_add_token: more tokens than the vocabulary size"); return -1; }
  if (2 * (b->n_strs + 1) > b->str_cap && grow_strs(b) != 0) return -1;
  if (b->arena_len + len > b->arena_cap) {
    size_t cap = b->arena_cap ? b->arena_cap : 4096;
    while (cap < b->arena_len + len) cap *= 2;
    if (cap > UINT32_MAX) { lm_error("lm_bpe_add_token: tokens too long in total"); return -1; }
    char *a = realloc(b->arena, cap);
    if (!a) { lm_error("lm_bpe_add_token: out of memory"); return -1; }
    b->arena = a; b->arena_cap = cap;
  }
  size_t mask = b->str_cap - 1, i = hash_bytes(bytes, len) & mask;
  for (; b->strs[i].id >= 0; i = (i + 1) & mask) {
    str_slot *s = &b->strs[i];
    if (s->len == len && memcmp(b->arena + s->off, bytes, len) == 0) { s->id = id; return 0; }   /* last wins */
  }
  memcpy(b->arena + b->arena_len, bytes, len);
  b->strs[i] = (str_slot){ (uint32_t)b->arena_len, (uint32_t)len, id };
  b->arena_len += len;
  b->n_strs++;
  return 0;
}

static uint64_t pair_key(int32_t l, int32_t r) { return ((uint64_t)(uint32_t)l << 32 | (uint32_t)r) + 1; }

static const pair_slot *find_pair(const lm_bpe *b, int32_t l, int32_t r) {
  uint64_t key = pair_key(l, r);
  size_t mask = b->pair_cap - 1;
  for (size_t i = mix(key) & mask;; i = (i + 1) & mask) {
    if (b->pairs[i].key == 0) return NULL;
    if (b->pairs[i].key == key) return &b->pairs[i];
  }
}

int lm_bpe_add_merge(lm_bpe *b, int32_t left, int32_t right, int32_t merged, int32_t rank) {
  if (left < 0 || left >= b->n_vocab || right < 0 || right >= b->n_vocab || merged < 0 || merged >= b->n_vocab) {
    lm_error("lm_bpe_add_merge: id out of range"); return -1;
  }
  if (2 * (b->n_pairs + 1) > b->pair_cap) {   /* grow: merges may outnumber tokens */
    size_t cap = b->pair_cap * 2;
    pair_slot *p = calloc(cap, sizeof *p);
    if (!p) { lm_error("lm_bpe_add_merge: out of memory"); return -1; }
    for (size_t i = 0; i < b->pair_cap; i++) {
      if (!b->pairs[i].key) continue;
      size_t j = mix(b->pairs[i].key) & (cap - 1);
      while (p[j].key) j = (j + 1) & (cap - 1);
      p[j] = b->pairs[i];
    }
    free(b->pairs); b->pairs = p; b->pair_cap = cap;
  }
  uint64_t key = pair_key(left, right);
  size_t mask = b->pair_cap - 1, i = mix(key) & mask;
  while (b->pairs[i].key && b->pairs[i].key != key) i = (i + 1) & mask;
  if (b->pairs[i].key != key) b->n_pairs++;
  b->pairs[i] = (pair_slot){ key, rank, merged };   /* a pair given twice: the last rank, as in tokenizers' map */
  return 0;
}

int lm_bpe_set_options(lm_bpe *b, int32_t byte_level, int32_t ignore_merges, int32_t unk_id, const int32_t *byte_ids) {
  if (unk_id < -1 || unk_id >= b->n_vocab) { lm_error("lm_bpe_set_options: unk id out of range"); return -1; }
  b->byte_level = byte_level != 0;
  b->ignore_merges = ignore_merges != 0;
  b->unk_id = unk_id;
  for (int i = 0; i < 256; i++) {
    int32_t v = byte_ids ? byte_ids[i] : -1;
    b->byte_ids[i] = v >= 0 && v < b->n_vocab ? v : -1;
  }
  return 0;
}

int lm_bpe_set_fuse_unk(lm_bpe *b, int32_t fuse_unk) { b->fuse_unk = fuse_unk != 0; return 0; }

/* ---- one piece ---- */
typedef struct { int32_t id, prev, next, len; } sym;
typedef struct { int32_t rank, pos, merged; } cand;

static int cand_less(cand a, cand b) { return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos; }

static void heap_push(cand *h, int64_t *n, cand c) {
  int64_t i = (*n)++;
  while (i > 0) {
    int64_t p = (i - 1) / 2;
    if (!cand_less(c, h[p])) break;
    h[i] = h[p]; i = p;
  }
  h[i] = c;
}

static cand heap_pop(cand *h, int64_t *n) {
  cand top = h[0], last = h[--*n];
  int64_t i = 0;
  for (;;) {
    int64_t l = 2 * i + 1, r = l + 1, m = i;
    cand best = last;
    if (l < *n && cand_less(h[l], best)) { m = l; best = h[l]; }
    if (r < *n && cand_less(h[r], best)) m = r;
    if (m == i) break;
    h[i] = h[m]; i = m;
  }
  if (*n > 0) h[i] = last;
  return top;
}

static int utf8_len(unsigned char c) { return c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1; }

/* the first symbols: bytes, or characters with byte fallback; -1 when a
 * symbol has no id and there is no unk. As tokenizers' merge_word: an
 * unknown character whose bytes all have <0xXX> tokens becomes those (an
 * unk waiting to be written stays waiting: it lands after them, as there);
 * otherwise an unk, fused with the unk before it under fuse_unk. */
static int64_t initial_symbols(const lm_bpe *b, const char *s, size_t n, sym *out) {
  int64_t k = 0;
  int32_t unk_len = 0;   /* > 0: an unk waiting, covering that many bytes */
  for (size_t i = 0; i < n;) {
    size_t len = b->byte_level ? 1 : (size_t)utf8_len((unsigned char)s[i]);
    if (i + len > n) len = n - i;
    int32_t id = find_str(b, s + i, len);
    int fallback = id < 0 && !b->byte_level;
    for (size_t j = 0; fallback && j < len; j++) fallback = b->byte_ids[(unsigned char)s[i + j]] >= 0;
    if (id >= 0) {
      if (unk_len) { out[k++] = (sym){ b->unk_id, 0, 0, unk_len }; unk_len = 0; }
      out[k++] = (sym){ id, 0, 0, (int32_t)len };
    } else if (fallback) {
      for (size_t j = 0; j < len; j++) out[k++] = (sym){ b->byte_ids[(unsigned char)s[i + j]], 0, 0, 1 };
    } else if (b->unk_id >= 0) {
      if (unk_len && !b->fuse_unk) out[k++] = (sym){ b->unk_id, 0, 0, unk_len };
      unk_len = (unk_len && b->fuse_unk ? unk_len : 0) + (int32_t)len;
    } else {
      char hex[4 * 4 + 1] = "";
      for (size_t j = 0; j < len && j < 4; j++) snprintf(hex + 4 * j, 5, "\\x%02x", (unsigned char)s[i + j]);
      lm_error("lm_bpe_encode: the character \"%s\" is not in the vocabulary (nor its bytes' <0xXX> tokens) "
               "and the model has no unk_token", hex);
      return -1;
    }
    i += len;
  }
  if (unk_len) out[k++] = (sym){ b->unk_id, 0, 0, unk_len };
  for (int64_t i = 0; i < k; i++) { out[i].prev = (int32_t)i - 1; out[i].next = i + 1 < k ? (int32_t)i + 1 : -1; }
  return k;
}

static void push_pair(const lm_bpe *b, const sym *s, int32_t pos, cand *h, int64_t *nh) {
  int32_t nx = s[pos].next;
  if (nx < 0) return;
  const pair_slot *p = find_pair(b, s[pos].id, s[nx].id);
  if (p) heap_push(h, nh, (cand){ p->rank, pos, p->merged });
}

/* encodes the piece text[start..stop) into out (at most cap ids); returns
 * the count, or -1 on error. cap >= stop - start always suffices. */
int64_t lm_bpe_encode(const lm_bpe *b, const char *text, size_t start, size_t stop, int32_t *out, int64_t cap) {
  if (stop <= start) return 0;
  const char *s = text + start;
  size_t n = stop - start;
  if (n > (size_t)LM_BPE_MAX_PIECE_BYTES) { lm_error("lm_bpe_encode: a piece of %zu bytes is longer than the %d a piece may have "
                                                        "(split the text)", n, LM_BPE_MAX_PIECE_BYTES); return -1; }
  if (b->ignore_merges) {
    int32_t id = find_str(b, s, n);
    if (id >= 0) {
      if (cap < 1) { lm_error("lm_bpe_encode: output too small"); return -1; }
      out[0] = id;
      return 1;
    }
  }
  /* scratch: n symbols, and n - 1 first pairs + at most 2 per merge; on
   * the stack for the short pieces most words are */
  enum { SHORT = 64 };
  sym sy_short[SHORT];
  cand h_short[3 * SHORT + 1];
  int heap = n > SHORT;
  sym *sy = heap ? malloc(n * sizeof *sy) : sy_short;
  cand *h = heap ? malloc((3 * n + 1) * sizeof *h) : h_short;
  if (!sy || !h) { if (heap) { free(sy); free(h); } lm_error("lm_bpe_encode: out of memory"); return -1; }
  int64_t k = initial_symbols(b, s, n, sy), nh = 0;
  if (k < 0) { if (heap) { free(sy); free(h); } return -1; }
  for (int32_t i = 0; i + 1 < k; i++) push_pair(b, sy, i, h, &nh);
  while (nh > 0) {
    cand c = heap_pop(h, &nh);
    sym *cur = &sy[c.pos];
    if (cur->len == 0 || cur->next < 0) continue;   /* merged away, or now last */
    int32_t nx = cur->next;
    const pair_slot *p = find_pair(b, cur->id, sy[nx].id);
    if (!p || p->merged != c.merged) continue;      /* a stale entry */
    cur->id = c.merged;
    cur->len += sy[nx].len;
    cur->next = sy[nx].next;
    sy[nx].len = 0;
    if (cur->next >= 0) sy[cur->next].prev = c.pos;
    if (cur->prev >= 0) push_pair(b, sy, cur->prev, h, &nh);
    push_pair(b, sy, c.pos, h, &nh);
  }
  int64_t m = 0;
  for (int32_t i = 0; i >= 0 && i < k; i = sy[i].next) {
    if (m >= cap) { if (heap) { free(sy); free(h); } lm_error("lm_bpe_encode: output too small"); return -1; }
    out[m++] = sy[i].id;
  }
  if (heap) { free(sy); free(h); }
  return m;
}

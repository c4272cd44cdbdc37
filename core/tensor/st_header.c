/* st_header.c: the JSON header of a safetensors file, parsed with bounded
 * work. The header comes from elsewhere (hostile): the parser is a loop
 * over its bytes with no recursion past a fixed depth, one pass, memory in
 * proportion to the header, and it enforces every rule of the format as
 * the reference implementation does: UTF-8 text, no duplicate keys, a
 * known dtype, a shape of non-negative integers, data_offsets that match
 * the shape and tile the data bytes exactly (none overlapping, none owned
 * by no tensor), and a __metadata__ object of strings. */
#include "tensor.h"
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

enum { DEPTH_LIMIT = 64 };   /* unknown fields are skipped up to this depth */

static const char *const st_names[] = { "F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8",
                                        "U64", "U32", "U16", "U8", "BOOL", "F8_E4M3", "F8_E5M2" };
static const int st_sizes[] = { 8, 4, 2, 2, 8, 4, 2, 1, 8, 4, 2, 1, 1, 1, 1 };
enum { NDTYPES = sizeof st_sizes / sizeof st_sizes[0] };

const char *lm_st_dtype_name(int dtype) { return dtype >= 0 && dtype < NDTYPES ? st_names[dtype] : NULL; }
int lm_st_dtype_size(int dtype) { return dtype >= 0 && dtype < NDTYPES ? st_sizes[dtype] : 0; }

typedef struct {
  const unsigned char *p, *end, *start;
  lm_st_header *h;
  int64_t n_cap, shapes_len, shapes_cap, strings_len, strings_cap, meta_cap;
} parser;

static void *grow(void *buf, int64_t *cap, int64_t need, size_t elem) {
  if (need <= *cap) return buf;
  int64_t c = *cap ? *cap : 64;
  while (c < need) c *= 2;
  void *b = realloc(buf, (size_t)c * elem);
  if (b) *cap = c;
  return b;
}
/* grows ps->h->field to hold need elements, or returns an error */
#define GROW(ps, field, cap, need) do {                                          \
    void *b_ = grow((ps)->h->field, &(ps)->cap, (need), sizeof *(ps)->h->field); \
    if (!b_) return lm_error("safetensors header: out of memory");               \
    (ps)->h->field = b_;                                                         \
  } while (0)

static void ws(parser *ps) {
  while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')) ps->p++;
}
static int at_end(parser *ps) { ws(ps); return ps->p >= ps->end; }
static int expect(parser *ps, char c) {
  ws(ps);
  if (ps->p >= ps->end) return lm_error("the header is not valid JSON (it ends where '%c' was expected) (corrupt)", c);
  if (*ps->p != c) {
    return lm_error("the header is not valid JSON ('%c' expected at byte %lld) (corrupt)", c,
                    (long long)(ps->p - ps->start));
  }
  ps->p++;
  return 0;
}
/* the next non-space byte, not consumed (0 at the end) */
static int peek(parser *ps) { ws(ps); return ps->p < ps->end ? *ps->p : 0; }

static int put_utf8(parser *ps, uint32_t c) {
  GROW(ps, strings, strings_cap, ps->strings_len + 4);
  char *o = ps->h->strings + ps->strings_len;
  int n = c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
  if (n == 1) o[0] = (char)c;
  else if (n == 2) { o[0] = (char)(0xC0 | c >> 6); o[1] = (char)(0x80 | (c & 63)); }
  else if (n == 3) { o[0] = (char)(0xE0 | c >> 12); o[1] = (char)(0x80 | (c >> 6 & 63)); o[2] = (char)(0x80 | (c & 63)); }
  else { o[0] = (char)(0xF0 | c >> 18); o[1] = (char)(0x80 | (c >> 12 & 63)); o[2] = (char)(0x80 | (c >> 6 & 63));
         o[3] = (char)(0x80 | (c & 63)); }
  ps->strings_len += n;
  return 0;
}
static int hex4(parser *ps, uint32_t *v) {
  if (ps->end - ps->p < 4) return lm_error("a \\u escape is cut short (corrupt header)");
  *v = 0;
  for (int i = 0; i < 4; i++) {
    int c = *ps->p++, d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                        : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return lm_error("a \\u escape holds '%c', not a hex digit (corrupt header)", c);
    *v = *v * 16 + (uint32_t)d;
  }
  return 0;
}

/* a JSON string, decoded into h->strings (NUL-terminated); *off, *len */
static int string_at(parser *ps, int64_t *off, int64_t *len) {
  if (expect(ps, '"')) return -1;
  *off = ps->strings_len;
  for (;;) {
    if (ps->p >= ps->end) return lm_error("the header is not valid JSON (a string is not closed) (corrupt)");
    const unsigned char *s = ps->p;
    while (ps->p < ps->end && *ps->p != '"' && *ps->p != '\\' && *ps->p >= 0x20) ps->p++;
    GROW(ps, strings, strings_cap, ps->strings_len + (ps->p - s) + 1);
    memcpy(ps->h->strings + ps->strings_len, s, (size_t)(ps->p - s));
    ps->strings_len += ps->p - s;
    if (ps->p >= ps->end) continue;
    int c = *ps->p++;
    if (c == '"') break;
    if (c < 0x20) return lm_error("a string of the header holds control byte 0x%02x (corrupt)", c);
    if (ps->p >= ps->end) continue;
    c = *ps->p++;
    const char *simple = strchr("\"\\/bfnrt", c);
    if (c && simple) {
      if (put_utf8(ps, (uint32_t)"\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"])) return -1;
    } else if (c == 'u') {
      uint32_t u, lo;
      if (hex4(ps, &u)) return -1;
      if (u >= 0xD800 && u < 0xDC00) {   /* a surrogate pair */
        if (ps->end - ps->p < 2 || ps->p[0] != '\\' || ps->p[1] != 'u') return lm_error("a lone surrogate in a string (corrupt header)");
        ps->p += 2;
        if (hex4(ps, &lo)) return -1;
        if (lo < 0xDC00 || lo >= 0xE000) return lm_error("a lone surrogate in a string (corrupt header)");
        u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
      } else if (u >= 0xDC00 && u < 0xE000) {
        return lm_error("a lone surrogate in a string (corrupt header)");
      }
      if (put_utf8(ps, u)) return -1;
    } else {
      return lm_error("a string of the header has the bad escape \\%c (corrupt)", c);
    }
  }
  *len = ps->strings_len - *off;
  GROW(ps, strings, strings_cap, ps->strings_len + 1);
  ps->h->strings[ps->strings_len++] = 0;
  return 0;
}

/* what a value is, for messages: its first bytes (up to 24) */
static int token_len(parser *ps) {
  int n = 0;
  while (ps->p + n < ps->end && n < 24 && !strchr(",]} \t\r\n", ps->p[n])) n++;
  return n;
}

/* a non-negative JSON integer below 2^53 */
static int uint_at(parser *ps, int64_t *v, const char *what) {
  int c = peek(ps);
  const unsigned char *s = ps->p;
  if (c < '0' || c > '9') return lm_error("%s is %.*s, not a size (corrupt header)", what, token_len(ps), (const char *)s);
  *v = 0;
  while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
    if (*v > (INT64_C(1) << 53) / 10) return lm_error("%s is over 2^53 (corrupt header)", what);
    *v = *v * 10 + (*ps->p++ - '0');
  }
  if ((ps->p - s > 1 && *s == '0') || (ps->p < ps->end && (*ps->p == '.' || *ps->p == 'e' || *ps->p == 'E'))) {
    ps->p = s;
    return lm_error("%s is %.*s, not a size (corrupt header)", what, token_len(ps), (const char *)s);
  }
  if (*v > (INT64_C(1) << 53)) return lm_error("%s is over 2^53 (corrupt header)", what);
  return 0;
}

/* skips any JSON value (an unknown field), nested at most DEPTH_LIMIT deep */
static int skip_value(parser *ps, int depth) {
  if (depth > DEPTH_LIMIT) return lm_error("the header nests deeper than %d (corrupt)", DEPTH_LIMIT);
  int c = peek(ps);
  int64_t o, l;
  if (c == '"') { int r = string_at(ps, &o, &l); ps->strings_len = o; return r; }
  if (c == '{' || c == '[') {
    ps->p++;
    int close = c == '{' ? '}' : ']';
    if (peek(ps) == close) { ps->p++; return 0; }
    for (;;) {
      if (c == '{') {
        if (string_at(ps, &o, &l)) return -1;
        ps->strings_len = o;
        if (expect(ps, ':')) return -1;
      }
      if (skip_value(ps, depth + 1)) return -1;
      if (peek(ps) == ',') { ps->p++; continue; }
      return expect(ps, (char)close);
    }
  }
  static const char *const words[] = { "true", "false", "null" };
  for (int i = 0; i < 3; i++) {
    size_t n = strlen(words[i]);
    if ((size_t)(ps->end - ps->p) >= n && !memcmp(ps->p, words[i], n)) { ps->p += n; return 0; }
  }
  if (c == '-' || (c >= '0' && c <= '9')) {   /* a number, loosely: it is ignored */
    ps->p++;
    while (ps->p < ps->end && strchr("0123456789.eE+-", *ps->p) && *ps->p) ps->p++;
    return 0;
  }
  return lm_error("the header is not valid JSON (a bad value at byte %lld) (corrupt)", (long long)(ps->p - ps->start));
}

static int dims_at(parser *ps, lm_st_entry *e, const char *name) {
  char what[300];
  if (expect(ps, '[')) return -1;
  e->shape = ps->shapes_len;
  if (peek(ps) == ']') { ps->p++; return 0; }
  for (;;) {
    if (e->ndim >= LM_MAX_DIMS) return lm_error("tensor %.200s: a shape of more than %d dims", name, LM_MAX_DIMS);
    snprintf(what, sizeof what, "tensor %.200s: shape[%d]", name, e->ndim + 1);
    GROW(ps, shapes, shapes_cap, ps->shapes_len + 1);
    if (uint_at(ps, &ps->h->shapes[ps->shapes_len], what)) return -1;
    ps->shapes_len++, e->ndim++;
    if (peek(ps) == ',') { ps->p++; continue; }
    return expect(ps, ']');
  }
}

static int offsets_at(parser *ps, lm_st_entry *e, const char *name) {
  char what[300];
  snprintf(what, sizeof what, "tensor %.200s: data_offsets", name);
  if (expect(ps, '[') || uint_at(ps, &e->begin, what) || expect(ps, ',') || uint_at(ps, &e->end, what)) {
    return lm_error("tensor %.200s: data_offsets is not [begin, end] with 0 <= begin <= end (corrupt header)", name);
  }
  if (peek(ps) != ']') return lm_error("tensor %.200s: data_offsets holds more than [begin, end] (corrupt header)", name);
  ps->p++;
  return 0;
}

/* one tensor's object: {"dtype": .., "shape": [..], "data_offsets": [b, e]} */
static int entry_at(parser *ps, lm_st_entry *e) {
  const char *name = NULL;
  int seen[3] = { 0, 0, 0 };
  e->ndim = 0, e->dtype = -1;
#define NAME (name = ps->h->strings + e->name)
  NAME;
  if (peek(ps) != '{') {
    return ps->p >= ps->end ? expect(ps, '{') : lm_error("tensor %.200s: its entry is not an object (corrupt header)", name);
  }
  ps->p++;
  if (peek(ps) == '}') { ps->p++; goto check; }
  for (;;) {
    int64_t k, kl, v, vl;
    if (string_at(ps, &k, &kl) || expect(ps, ':')) return -1;
    NAME;
    const char *key = ps->h->strings + k;
    int f = !strcmp(key, "dtype") ? 0 : !strcmp(key, "shape") ? 1 : !strcmp(key, "data_offsets") ? 2 : -1;
    if (f >= 0 && (size_t)kl != strlen(key)) f = -1;
    ps->strings_len = k;
    if (f >= 0 && seen[f]++) return lm_error("tensor %.200s: the key %s appears twice (corrupt header)", name, key);
    if (f == 0) {
      if (peek(ps) != '"') return lm_error("tensor %.200s: dtype is not a string (corrupt header)", name);
      if (string_at(ps, &v, &vl)) return -1;
      NAME;
      for (int i = 0; i < NDTYPES; i++) if (!strcmp(st_names[i], ps->h->strings + v) && (size_t)vl == strlen(st_names[i])) e->dtype = i;
      if (e->dtype < 0) return lm_error("tensor %.200s: unknown dtype %.40s (corrupt header)", name, ps->h->strings + v);
      ps->strings_len = v;
    } else if (f == 1) {
      if (peek(ps) != '[') return lm_error("tensor %.200s: its shape is not a list (corrupt header)", name);
      if (dims_at(ps, e, name)) return -1;
    } else if (f == 2) {
      if (offsets_at(ps, e, name)) return -1;
    } else if (skip_value(ps, 2)) {
      return -1;
    }
    if (peek(ps) == ',') { ps->p++; continue; }
    if (expect(ps, '}')) return -1;
    break;
  }
check:
  static const char *const fields[] = { "dtype", "shape", "data_offsets" };
  for (int f = 0; f < 3; f++) if (!seen[f]) return lm_error("tensor %.200s: %s is missing (corrupt header)", name, fields[f]);
#undef NAME
  return 0;
}

/* __metadata__: an object of strings */
static int metadata_at(parser *ps) {
  if (ps->h->has_meta++) return lm_error("the key __metadata__ appears twice (corrupt header)");
  if (peek(ps) != '{') return lm_error("__metadata__ is not an object of strings (corrupt header)");
  ps->p++;
  if (peek(ps) == '}') { ps->p++; return 0; }
  for (;;) {
    GROW(ps, meta, meta_cap, 4 * (ps->h->nmeta + 1));
    int64_t *m = ps->h->meta + 4 * ps->h->nmeta;
    if (string_at(ps, &m[0], &m[1]) || expect(ps, ':')) return -1;
    int c = peek(ps);
    if (c != '"') {
      const char *kind = c == '{' ? "an object" : c == '[' ? "a list" : c == 't' || c == 'f' ? "a boolean"
                       : c == 'n' ? "null" : "a number";
      return lm_error("__metadata__[%.200s] is %s, not a string (corrupt header)", ps->h->strings + m[0], kind);
    }
    if (string_at(ps, &m[2], &m[3])) return -1;
    ps->h->nmeta++;
    if (peek(ps) == ',') { ps->p++; continue; }
    return expect(ps, '}');
  }
}

static int utf8_ok(const unsigned char *s, int64_t n) {
  for (int64_t i = 0; i < n;) {
    unsigned c = s[i];
    int k = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : -1;
    if (k < 0 || i + k >= n) return 0;
    uint32_t u = k == 0 ? c : c & (0x3F >> k);
    for (int j = 1; j <= k; j++) {
      if ((s[i + j] & 0xC0) != 0x80) return 0;
      u = u << 6 | (s[i + j] & 0x3F);
    }
    if ((k == 1 && u < 0x80) || (k == 2 && (u < 0x800 || (u >= 0xD800 && u < 0xE000))) ||
        (k == 3 && (u < 0x10000 || u > 0x10FFFF))) return 0;
    i += k + 1;
  }
  return 1;
}

static _Thread_local const char *sort_strings;
static int by_name(const void *a, const void *b) {
  const lm_st_entry *x = a, *y = b;
  int64_t n = x->name_len < y->name_len ? x->name_len : y->name_len;
  int c = memcmp(sort_strings + x->name, sort_strings + y->name, (size_t)n);
  return c ? c : (x->name_len > y->name_len) - (x->name_len < y->name_len);
}
static int by_key(const void *a, const void *b) {
  const int64_t *x = a, *y = b;
  lm_st_entry ex = { .name = x[0], .name_len = x[1] }, ey = { .name = y[0], .name_len = y[1] };
  return by_name(&ex, &ey);
}
static int by_offset(const void *a, const void *b) {
  const lm_st_entry *x = *(lm_st_entry *const *)a, *y = *(lm_st_entry *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return (x->end > y->end) - (x->end < y->end);
}

/* sizes, duplicates, and the data bytes tiled exactly by the tensors */
static int check_all(lm_st_header *h, int64_t data_len) {
  const char *S = h->strings;
  for (int64_t i = 0; i < h->n; i++) {
    lm_st_entry *e = &h->entries[i];
    const char *name = S + e->name;
    if (e->begin > e->end) return lm_error("tensor %.200s: data_offsets is not [begin, end] with 0 <= begin <= end (corrupt header)", name);
    if (e->end > data_len) {
      return lm_error("tensor %.200s: its data (bytes %lld to %lld after the header) runs past the end of the file, "
                      "which holds %lld bytes of data (truncated?)", name, (long long)e->begin, (long long)e->end,
                      (long long)data_len);
    }
    int64_t need = st_sizes[e->dtype];
    for (int d = 0; d < e->ndim; d++) {
      int64_t s = h->shapes[e->shape + d];
      if (s != 0 && need > (INT64_C(1) << 53) / s) return lm_error("tensor %.200s: its shape holds more than 2^53 bytes (corrupt header)", name);
      need *= s;
    }
    if (e->end - e->begin != need) {
      char dims[200] = "a scalar";
      for (int d = 0, at = 0; d < e->ndim && at < 180; d++) {
        at += snprintf(dims + at, sizeof dims - at, d ? "x%lld" : "%lld", (long long)h->shapes[e->shape + d]);
      }
      return lm_error("tensor %.200s: data_offsets [%lld, %lld] hold %lld bytes, but dtype %s and shape %s need %lld "
                      "(corrupt header)", name, (long long)e->begin, (long long)e->end, (long long)(e->end - e->begin),
                      st_names[e->dtype], dims, (long long)need);
    }
  }
  sort_strings = S;
  int64_t sorted = 1;   /* writers usually list names in order: skip the sort then */
  for (int64_t i = 1; i < h->n && sorted; i++) sorted = by_name(&h->entries[i - 1], &h->entries[i]) < 0;
  if (!sorted) qsort(h->entries, (size_t)h->n, sizeof *h->entries, by_name);
  for (int64_t i = 1; i < h->n; i++) {
    if (!by_name(&h->entries[i - 1], &h->entries[i])) return lm_error("the tensor %.200s appears twice (corrupt header)", S + h->entries[i].name);
  }
  if (h->nmeta > 1) qsort(h->meta, (size_t)h->nmeta, 4 * sizeof *h->meta, by_key);
  for (int64_t i = 1; i < h->nmeta; i++) {
    if (!by_key(h->meta + 4 * (i - 1), h->meta + 4 * i)) return lm_error("__metadata__[%.200s] appears twice (corrupt header)", S + h->meta[4 * i]);
  }
  lm_st_entry **o = malloc((size_t)(h->n ? h->n : 1) * sizeof *o);
  if (!o) return lm_error("safetensors header: out of memory");
  for (int64_t i = 0; i < h->n; i++) o[i] = &h->entries[i];
  sorted = 1;
  for (int64_t i = 1; i < h->n && sorted; i++) sorted = by_offset(&o[i - 1], &o[i]) <= 0;
  if (!sorted) qsort(o, (size_t)h->n, sizeof *o, by_offset);
  int64_t at = 0;
  int rc = 0;
  for (int64_t i = 0; i < h->n && !rc; i++) {
    if (o[i]->begin < at) rc = lm_error("tensors %.200s and %.200s overlap (corrupt header)", S + o[i - 1]->name, S + o[i]->name);
    else if (o[i]->begin > at) rc = lm_error("bytes %lld to %lld of the data belong to no tensor (before %.200s) (corrupt header)",
                                             (long long)at, (long long)o[i]->begin, S + o[i]->name);
    at = o[i]->end;
  }
  free(o);
  if (!rc && at != data_len) rc = lm_error("bytes %lld to %lld of the data belong to no tensor (corrupt header)", (long long)at, (long long)data_len);
  return rc;
}

static int parse(parser *ps, int64_t data_len) {
  lm_st_header *h = ps->h;
  if (!utf8_ok(ps->p, ps->end - ps->p)) return lm_error("the header is not UTF-8 text (corrupt)");
  if (peek(ps) != '{') return lm_error("the header is not a JSON object (corrupt)");
  ps->p++;
  if (peek(ps) != '}') {
    for (;;) {
      int64_t k, kl;
      if (string_at(ps, &k, &kl) || expect(ps, ':')) return -1;
      if (kl == 12 && !strcmp(h->strings + k, "__metadata__")) {
        ps->strings_len = k;
        if (metadata_at(ps)) return -1;
      } else {
        GROW(ps, entries, n_cap, h->n + 1);
        lm_st_entry *e = &h->entries[h->n++];
        memset(e, 0, sizeof *e);
        e->name = k, e->name_len = kl;
        if (entry_at(ps, e)) return -1;
      }
      if (peek(ps) == ',') { ps->p++; continue; }
      if (expect(ps, '}')) return -1;
      break;
    }
  } else {
    ps->p++;
  }
  if (!at_end(ps)) return lm_error("trailing bytes after the header's JSON (corrupt)");
  return check_all(h, data_len);
}

lm_st_header *lm_st_header_parse(const char *json, int64_t len, int64_t data_len) {
  lm_st_header *h = calloc(1, sizeof *h);
  if (!h) { lm_error("safetensors header: out of memory"); return NULL; }
  parser ps = { .p = (const unsigned char *)json, .end = (const unsigned char *)json + len, .h = h };
  ps.start = ps.p;
  if (parse(&ps, data_len)) {
    lm_st_header_free(h);
    return NULL;
  }
  return h;
}

void lm_st_header_free(lm_st_header *h) {
  if (!h) return;
  free(h->entries), free(h->shapes), free(h->strings), free(h->meta), free(h);
}

/* the deepest nesting of [ and { in JSON text (strings skipped), stopping
 * past limit: a cheap guard before a recursive decoder sees the text */
int lm_json_depth(const char *s, int64_t len, int limit) {
  int depth = 0, max = 0;
  for (int64_t i = 0; i < len && max <= limit; i++) {
    char c = s[i];
    if (c == '"') {
      for (i++; i < len && s[i] != '"'; i++) if (s[i] == '\\') i++;
    } else if (c == '[' || c == '{') {
      if (++depth > max) max = depth;
    } else if (c == ']' || c == '}') {
      depth--;
    }
  }
  return max;
}

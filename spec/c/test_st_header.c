/* test_st_header.c: the safetensors header parser (core/tensor/st_header.c)
 * on a good header (names sorted, shapes, offsets, metadata, escapes) and
 * on 200000 seeded mutations of it: each parses or fails with a message,
 * never reads past its input (built with LOOM_SANITIZE=ON, ASan checks
 * that; each input is an exact-size heap copy). Prints "N passed, N failed". */
#include "check.h"
#include "loom.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char GOOD[] =
  "{\"__metadata__\":{\"format\":\"pt\"},\"b\":{\"dtype\":\"BOOL\",\"shape\":[],\"data_offsets\":[24,25]},"
  "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
  "\"c\\u00e9\":{\"dtype\":\"BF16\",\"shape\":[0],\"data_offsets\":[25,25],\"x\":[1,{\"y\":null}]}}";

static lm_st_header *parse(const char *s, size_t n, int64_t data_len) {
  char *heap = malloc(n ? n : 1);
  memcpy(heap, s, n);
  lm_st_header *h = lm_st_header_parse(heap, (int64_t)n, data_len);
  free(heap);
  return h;
}

static void test_good(void) {
  lm_st_header *h = parse(GOOD, strlen(GOOD), 25);
  CHECK(h != NULL);
  if (!h) { fprintf(stderr, "%s\n", lm_last_error()); return; }
  CHECK(h->n == 3 && h->nmeta == 1);
  CHECK(!strcmp(h->strings + h->entries[0].name, "a") && !strcmp(h->strings + h->entries[1].name, "b"));
  CHECK(!strcmp(h->strings + h->entries[2].name, "c\xc3\xa9"));
  CHECK(h->entries[0].ndim == 2 && h->shapes[h->entries[0].shape + 1] == 3 && h->entries[0].end == 24);
  CHECK(!strcmp(lm_st_dtype_name(h->entries[1].dtype), "BOOL") && h->entries[1].ndim == 0);
  CHECK(!strcmp(h->strings + h->meta[0], "format") && !strcmp(h->strings + h->meta[2], "pt"));
  lm_st_header_free(h);
  CHECK(parse(GOOD, strlen(GOOD), 26) == NULL && strstr(lm_last_error(), "belong to no tensor"));
  CHECK(parse(GOOD, strlen(GOOD), 24) == NULL && strstr(lm_last_error(), "runs past the end"));
}

static void test_mutations(void) {
  static const char *toks[] = { "null", "-1", "1.5", "1e9", "99999999999999999999", "\"", "\\u", "\\ud800", "[",
                                "{", "]", "}", ",", ":", "\"F32\"", "\"__metadata__\"", "\xff", "\x01", "0",
                                "[[[[[[[[[[" };
  char buf[1024];
  long parsed = 0, refused = 0, silent = 0;
  srand(26);
  for (int it = 0; it < 200000; it++) {
    size_t n = strlen(GOOD);
    memcpy(buf, GOOD, n);
    for (int m = 1 + rand() % 4; m > 0; m--) {
      size_t at = (size_t)rand() % n;
      int k = rand() % 3;
      if (k == 0) n = at;
      else if (k == 1) buf[at] = (char)(rand() % 256);
      else {
        const char *t = toks[rand() % 20];
        size_t tl = strlen(t);
        if (n + tl < sizeof buf) { memmove(buf + at + tl, buf + at, n - at); memcpy(buf + at, t, tl); n += tl; }
      }
      if (n == 0) break;
    }
    lm_clear_error();
    lm_st_header *h = parse(buf, n, 25);
    if (h) { parsed++; lm_st_header_free(h); }
    else if (strcmp(lm_last_error(), "unknown error")) refused++;
    else silent++;
  }
  CHECK(parsed + refused == 200000 && silent == 0);
  CHECK(refused > 100000);
  printf("mutations: %ld parsed, %ld refused with a message\n", parsed, refused);
}

int main(void) {
  test_good();
  test_mutations();
  return check_report();
}

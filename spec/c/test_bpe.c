/* test_bpe.c: the BPE merge loop (core/text/bpe.c) on hand-made
 * vocabularies: merges apply lowest rank first, the leftmost among equal
 * ranks, a merge that a lower one broke up is skipped, byte fallback and
 * unk, ignore_merges, long pieces, and bad input refused. Prints "N passed,
 * N failed"; exits non-zero on any failure. */
#include "check.h"
#include "loom.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void expect(const char *what, const int32_t *got, int64_t n, const int32_t *want, int64_t m) {
  int ok = n == m && (n <= 0 || memcmp(got, want, (size_t)n * sizeof *got) == 0);
  if (ok) { passed++; return; }
  failed++;
  fprintf(stderr, "FAIL %s: got", what);
  for (int64_t i = 0; i < n; i++) fprintf(stderr, " %d", got[i]);
  fprintf(stderr, " (%lld ids), want", (long long)n);
  for (int64_t i = 0; i < m; i++) fprintf(stderr, " %d", want[i]);
  fprintf(stderr, "\n");
}

static int64_t enc(lm_bpe *b, const char *s, int32_t *out) { return lm_bpe_encode(b, s, 0, strlen(s), out, 4096); }

int main(void) {
  /* a=0 b=1 c=2 ab=3 bc=4 abc=5 aa=6 aaa=7 */
  const char *toks[] = { "a", "b", "c", "ab", "bc", "abc", "aa", "aaa" };
  lm_bpe *b = lm_bpe_new(300);
  for (int i = 0; i < 8; i++) lm_bpe_add_token(b, toks[i], strlen(toks[i]), i);
  lm_bpe_add_merge(b, 1, 2, 4, 0);   /* b c -> bc, rank 0 */
  lm_bpe_add_merge(b, 0, 1, 3, 1);   /* a b -> ab, rank 1 */
  lm_bpe_add_merge(b, 3, 2, 5, 2);   /* ab c -> abc: never reached from "abc", bc merges first */
  lm_bpe_add_merge(b, 0, 0, 6, 3);   /* a a -> aa */
  lm_bpe_add_merge(b, 6, 0, 7, 4);   /* aa a -> aaa */
  lm_bpe_set_options(b, 1, 0, -1, NULL);
  int32_t out[4096];
  int64_t n = enc(b, "abc", out);
  expect("abc: bc (rank 0) before ab", out, n, (int32_t[]){ 0, 4 }, 2);
  n = enc(b, "abab", out);
  expect("abab", out, n, (int32_t[]){ 3, 3 }, 2);
  n = enc(b, "aaaa", out);   /* aa aa (leftmost first), then no merge (aa aa is none) */
  expect("aaaa: leftmost pairs first", out, n, (int32_t[]){ 6, 6 }, 2);
  n = enc(b, "aaaaa", out);   /* aa aa a -> aa aaa */
  expect("aaaaa", out, n, (int32_t[]){ 6, 7 }, 2);
  n = lm_bpe_encode(b, "xxabcxx", 2, 5, out, 16);
  expect("a piece inside a text", out, n, (int32_t[]){ 0, 4 }, 2);
  n = enc(b, "abd", out);   /* d has no id and there is no unk */
  expect("an unknown byte without unk is an error", out, n < 0 ? 0 : n, NULL, 0);
  if (n >= 0 || !strstr(lm_last_error(), "no unk")) { failed++; fprintf(stderr, "FAIL unknown byte: %s\n", lm_last_error()); }
  lm_bpe_set_options(b, 1, 1, -1, NULL);   /* ignore_merges: a piece in the vocabulary is one token */
  n = enc(b, "abc", out);
  expect("ignore_merges", out, n, (int32_t[]){ 5 }, 1);
  /* characters with byte fallback: é (C3 A9) unknown -> its bytes' tokens */
  int32_t bytes[256];
  for (int i = 0; i < 256; i++) bytes[i] = 10 + i;
  lm_bpe_set_options(b, 0, 0, 9, bytes);
  n = enc(b, "a\xc3\xa9" "b", out);
  expect("byte fallback", out, n, (int32_t[]){ 0, 10 + 0xc3, 10 + 0xa9, 1 }, 4);
  lm_bpe_set_options(b, 0, 0, 9, NULL);
  n = enc(b, "a\xc3\xa9", out);
  expect("unk for an unknown character", out, n, (int32_t[]){ 0, 9 }, 2);
  /* a long piece: 3000 a's -> 1000 aaa (every merge through the heap) */
  char *longs = malloc(3001);
  memset(longs, 'a', 3000);
  longs[3000] = 0;
  lm_bpe_set_options(b, 1, 0, -1, NULL);
  n = enc(b, longs, out);
  int ok = n == 1500;   /* aa then aa aa ... : 1500 aa (aa aa has no merge) */
  for (int64_t i = 0; ok && i < n; i++) ok = out[i] == 6;
  if (ok) passed++; else { failed++; fprintf(stderr, "FAIL 3000 a's: %lld ids\n", (long long)n); }
  free(longs);
  /* bad input */
  int bad = lm_bpe_add_token(b, "z", 1, 300) == 0 || lm_bpe_add_merge(b, 0, 1, -1, 9) == 0 ||
            lm_bpe_add_token(b, "", 0, 1) == 0 || lm_bpe_new(0) != NULL || lm_bpe_encode(b, "abc", 0, 3, out, 1) >= 0;
  if (bad) { failed++; fprintf(stderr, "FAIL bad input accepted\n"); } else passed++;
  lm_bpe_free(b);
  return check_report();
}

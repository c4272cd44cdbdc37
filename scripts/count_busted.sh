# count_busted.sh: sourced by scripts/test.sh and scripts/test_emu.sh.
# count_busted adds the last busted summary in "$log" ("N successes / N
# failures / N errors / N pending") to $passed and $failed, and leaves it in
# $busted_line; no summary counts as one failure (busted died).
count_busted() {
  local s f e
  busted_line=$(grep -aE '[0-9]+ success(es)? / [0-9]+ failures? / [0-9]+ errors?' "$log" | tail -1)
  if [ -z "$busted_line" ]; then
    failed=$((failed + 1)); echo "   (no busted summary: counted as a failure)"; return
  fi
  s=$(grep -oE '[0-9]+ success' <<<"$busted_line" | grep -oE '[0-9]+')
  f=$(grep -oE '[0-9]+ failure' <<<"$busted_line" | grep -oE '[0-9]+')
  e=$(grep -oE '[0-9]+ error' <<<"$busted_line" | grep -oE '[0-9]+')
  passed=$((passed + s)); failed=$((failed + f + e))
}

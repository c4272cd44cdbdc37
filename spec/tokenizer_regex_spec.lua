-- tokenizer_regex_spec.lua: a tokenizer.json's regexes are Oniguruma's (HF
-- tokenizers runs Oniguruma); loom runs PCRE2 (loom.text.onig translates).
-- The pieces of real tokenizers' regexes (GPT-2, Llama 3, Qwen2, Qwen3.5,
-- o200k, DeepSeek, SentencePiece's user-defined tokens and whitespace rules)
-- under every Split behavior equal the pieces HF gave on texts with other
-- whitespace (U+0085, U+180E), folded letters (ſ, K), combining marks,
-- digits of other scripts, letters newer than PCRE2's Unicode 14 tables
-- (scripts/make_tokenizer_fixtures.py wrote them);
-- and what the two engines read differently is refused, naming the pattern.
local cjson = require("cjson")
local pipeline = require("loom.text.pipeline")
local regex = require("loom.text.regex")
local Tokenizer = require("loom").data.Tokenizer
local errmsg = require("support.ref").errmsg
local read = require("support.sys").read

local BEHAVIOR = { isolated = "Isolated", removed = "Removed", merged_with_previous = "MergedWithPrevious",
                   merged_with_next = "MergedWithNext", contiguous = "Contiguous" }

describe("tokenizer regexes", function()
  local expected = cjson.decode(read("spec/fixtures/tokenizers/regex.expected.json"))

  it("split every text into HF's pieces (Oniguruma's), under every behavior", function()
    assert.is_true(#expected.cases >= 20)
    for _, c in ipairs(expected.cases) do
      local pt = pipeline.pretokenizer({ type = "Split", pattern = { Regex = c.regex }, behavior = BEHAVIOR[c.behavior],
                                         invert = c.invert })
      for i, text in ipairs(expected.texts) do
        local t, starts, stops = pipeline.pieces(pt, text, true, regex.newer_than_tables(text))
        local got = {}
        for k = 1, #starts do got[k] = t:sub(starts[k] + 1, stops[k]) end
        assert.same(c.pieces[i], got, c.name .. " " .. c.behavior .. (c.invert and " inverted" or "") .. " on " .. text)
      end
    end
  end)

  -- each: a pattern HF's Oniguruma reads otherwise than PCRE2 (checked with
  -- tokenizers 0.23), and what the message names
  local refused = {
    { "\\w+", "\\w" },                       -- Oniguruma: letters, marks, digits, _; PCRE2 10.42: no marks
    { "\\h+", "\\h" },                       -- Oniguruma (Ruby): a hex digit; PCRE2: horizontal space
    { "[a[bc]]", "nested set" },             -- Oniguruma: a union; PCRE2: text
    { "[a-z&&[^aeiou]]", "intersection" },
    { "a{,2}", "{,n}" },
    { "a{2}?", "{n}?" },
    { "a{1,2}+", "{..}+" },
    { "(?i:ss)", "under (?i)" },              -- Oniguruma matches ß
    { "(?i:[a-z])", "a class under (?i)" },
    { "(?m:a.)", "the group (?m" },           -- Ruby: dot-all; PCRE2: multi-line
    { "\\p{Greek}", "only general categories" },
    { "\\xC3", "ASCII \\xHH" },
    { "(?<word>a)\\k<word>", "the group (?<" },
    { "(a)\\1", "\\1" },
    { "\\bword\\b", "\\b" },
    { "[\\S]", "\\S inside a class" },
  }

  it("refuses what Oniguruma and PCRE2 read differently, naming the pattern and the construct", function()
    for _, c in ipairs(refused) do
      local e = errmsg(pipeline.pretokenizer, { type = "Split", pattern = { Regex = c[1] }, behavior = "Isolated" })
      assert.truthy(e:find(string.format("%q", c[1]), 1, true), e)
      assert.truthy(e:find(c[2], 1, true), "expected «" .. c[2] .. "» in: " .. e)
      assert.truthy(e:find("Oniguruma and PCRE2", 1, true), e)
    end
  end)

  it("reads \\s as Oniguruma's White_Space: U+0085 in, U+180E out (PCRE2's own \\s holds U+180E)", function()
    local pt = pipeline.pretokenizer({ type = "Split", pattern = { Regex = "\\s+" }, behavior = "Removed" })
    local text = "a\u{85}b\u{180E}c\u{3000}d"
    assert.is_true(regex.newer_than_tables(text))   -- a text with U+180E runs the exact pattern
    local t, starts, stops = pipeline.pieces(pt, text, true, regex.newer_than_tables(text))
    local got = {}
    for k = 1, #starts do got[k] = t:sub(starts[k] + 1, stops[k]) end
    assert.same({ "a", "b\u{180E}c", "d" }, got)
  end)

  it("ends a regex that exhausts PCRE2's match limit with an error naming the pattern, not the text's UTF-8", function()
    local tok = Tokenizer.from_json({ model = { type = "BPE", vocab = { a = 0, b = 1 }, merges = {} },
      pre_tokenizer = { type = "Split", pattern = { Regex = "(a|aa)+$" }, behavior = "Isolated" } })
    local e = errmsg(tok.encode, tok, string.rep("a", 40) .. "b")
    assert.truthy(e:find('the regex "(a|aa)+$" reached PCRE2\'s limit', 1, true), e)
    assert.falsy(e:find("UTF-8", 1, true), e)
    e = errmsg(tok.encode, tok, "ab\xff")
    assert.truthy(e:find("not valid UTF-8 (byte 3 of 3", 1, true), e)
  end)
end)

-- docstrings_spec.lua: help() covers the whole public API. Every function
-- and class of the API's tables (lua/loom/repl/api.lua: loom, Tensor, F,
-- nn, optim, amp, distributed and its checkpoint, fsdp, pipelining and
-- context parallel, parallel, models, hf, data, Tokenizer, ...) has an
-- entry in lua/loom/docstrings.lua, found by enumerating the tables, so a
-- new public function without one fails here; no entry names something
-- that is gone. And help answers as a user asks: ?loom.cat about cat, a
-- method by x:name, an object by identity, topics wrapped to the width.
local loom = require("loom")
local api = require("loom.repl.api")
local docs = require("loom.docstrings")
local help = require("loom.repl.help")

-- the API's names without a docstring, and how many names there are
local function undocumented()
  local missing, total = {}, 0
  for _, place in ipairs(api.PLACES) do
    local t = api.table_of(place, true)
    assert.is_not_nil(t, "no table for " .. place[1])
    if not docs[place[4]] then missing[#missing + 1] = place[4] end
    for _, k in ipairs(api.names(place, t)) do
      total = total + 1
      if not docs[place[1] .. k] then missing[#missing + 1] = place[1] .. k end
    end
  end
  table.sort(missing)
  return missing, total
end

describe("the docstrings", function()
  it("cover every function and class of the public API", function()
    local missing, total = undocumented()
    assert.same({}, missing)
    assert.is_true(total > 400, total .. " names")
    for _, k in ipairs { "loom.generate", "hf.from_pretrained", "Tokenizer.from_file", "transformer.new", "loom.cat",
                         "nn.SiLU", "nn.ModuleList", "tp.SequenceParallel", "Tensor:chunk", "Tensor:add_",
                         "dist.checkpoint.save", "pp.Schedule1F1B", "nn.Module:parameters", "Optimizer:zero_grad" } do
      assert.is_string(docs[k], k)
    end
  end)

  it("catch a new public function without one", function()
    local nn = loom.nn
    nn.brand_new_layer = function() end
    loom.Tensor.brand_new_method = function() end
    local missing = undocumented()
    nn.brand_new_layer, loom.Tensor.brand_new_method = nil, nil
    assert.same({ "Tensor:brand_new_method", "nn.brand_new_layer" }, missing)
  end)

  it("name nothing that is gone", function()
    local known = { help = true, quit = true }
    for _, place in ipairs(api.PLACES) do
      known[place[4]] = true
      for _, k in ipairs(api.names(place, api.table_of(place, true))) do known[place[1] .. k] = true end
    end
    local stale = {}
    for k in pairs(docs) do if not known[k] then stale[#stale + 1] = k end end
    table.sort(stale)
    assert.same({}, stale)
  end)
end)

describe("help", function()
  it("answers ?loom.cat about cat, and names as users write them", function()
    assert.equal(docs["loom.cat"], help.text("loom.cat"))
    assert.equal(docs["loom.cat"], help.text("cat"))
    assert.equal(docs["hf.from_pretrained"], help.text("loom.models.hf.from_pretrained"))
    assert.equal(docs["Tokenizer.from_file"], help.text("loom.data.Tokenizer.from_file"))
    assert.equal(docs["Tensor:size"], help.text("x:size"))
    assert.equal(docs["nn.Module:parameters"], help.text("model:parameters"))
    assert.equal(docs["dist.all_reduce"], help.text("loom.distributed.all_reduce"))
    assert.truthy(help.text("siz"):find("see DeviceMesh:size, Group:size, Tensor:size", 1, true), help.text("siz"))
    assert.is_nil(help.text("cat_nothing"):find("Replicate", 1, true))
  end)

  it("finds objects by identity", function()
    assert.equal("loom.cat", help.name_of(loom.cat))
    assert.equal("nn.SiLU", help.name_of(loom.nn.SiLU))
    assert.equal("transformer.new", help.name_of(loom.models.transformer.new))
    assert.equal("Tensor:chunk", help.name_of(loom.Tensor.chunk))
    assert.equal("Tokenizer.from_file", help.name_of(loom.data.Tokenizer.from_file))
    assert.equal("nn", help.name_of(loom.nn))
    assert.equal("Tensor", help.name_of(loom.ones(1)))
  end)

  it("wraps the topics and a table's names to the terminal's width", function()
    for _, width in ipairs { 40, 80 } do
      local words = {}
      for i = 1, 60 do words[i] = "name" .. i end
      local text = help.wrap(words, "  ", width)
      for line in text:gmatch("[^\n]+") do assert.is_true(#line <= width, line) end
      assert.equal(table.concat(words, " "), (text:gsub("%s+", " "):gsub("^ ", "")))
    end
    local s = help.text("")
    assert.truthy(s:find("topics", 1, true))
    for _, t in ipairs { "nn", "dist.checkpoint", "hf", "data.Tokenizer", "Tensor" } do
      assert.truthy(s:find(t, 1, true), t)
    end
    local lines = 0
    for _ in s:gmatch("\n") do lines = lines + 1 end
    assert.is_true(lines >= 6, "the topics on several lines:\n" .. s)
    assert.truthy(help.text("nn"):find("nn.ModuleList", 1, true))
  end)
end)

-- generate_spec.lua (multi-rank): generation under tensor parallelism. The
-- HF checkpoints loaded onto a TP mesh generate the same ids as one process
-- (greedy: the reference's; sampled: the unsharded model's with the same
-- seed), and each rank's KV cache holds only its heads. Runs on 1, 2 or 4
-- ranks:
--   scripts/loomrun -n 2 --quiet-others scripts/run_specs.lua spec/dist/generate_spec.lua
-- Every rank collects its mismatches and asserts after all collectives ran.
local loom = require("loom")
local cjson = require("cjson")
local hf = loom.models.hf
local H = require("support.tp")
local sys = require("support.sys")

local FIX = "spec/fixtures/"
-- the checkpoints have 2 kv heads: on 4 ranks, TP 2 inside a {2, 2} mesh
local mesh = H.ws == 4 and require("loom.distributed").init_device_mesh("cpu", { 2, 2 },
  { mesh_dim_names = { "dp", "tp" } })["tp"] or H.world_mesh()
local function plus1(t) local o = {} for i, v in ipairs(t) do o[i] = v + 1 end return o end

for _, name in ipairs { "hf_llama_gqa", "hf_gpt2" } do
  describe("generate under TP " .. name, function()
    it("gives one process's ids, greedy and sampled, with the cache sharded by heads", function()
      local bad = {}
      local tp_model = hf.from_pretrained(FIX .. name, { tp_mesh = mesh })
      local one = hf.from_pretrained(FIX .. name)
      for i, c in ipairs(cjson.decode(sys.read(FIX .. name .. "/generate.json")).cases) do
        local prompt, want = plus1(c.prompt), plus1(c.greedy)
        local got = tp_model:generate(prompt, { max_new_tokens = #want - #prompt })
        if table.concat(got, ",") ~= table.concat(want, ",") then bad[#bad + 1] = "greedy case " .. i end
      end
      local opts = { max_new_tokens = 10, temperature = 1.3, top_p = 0.9, seed = 4 }
      local a, b = tp_model:generate({ 2, 9 }, opts), one:generate({ 2, 9 }, opts)
      if table.concat(a, ",") ~= table.concat(b, ",") then bad[#bad + 1] = "sampled" end
      -- ranks seeded differently: the draw of the mesh's first rank rules
      -- (each would sample other ids alone), so every rank returns one text
      local mine = tp_model:generate({ 2, 9 }, { max_new_tokens = 10, temperature = 1.3, seed = 10 + H.rank })
      local first = one:generate({ 2, 9 }, { max_new_tokens = 10, temperature = 1.3,
                                             seed = 10 + H.rank - mesh:get_local_rank(1) })   -- the tp group's first rank
      if table.concat(mine, ",") ~= table.concat(first, ",") then bad[#bad + 1] = "ranks seeded differently" end
      local cache = { pos = 0 }
      loom.no_grad(function() tp_model(loom.tensor({ { 1, 2, 3 } }, { dtype = "i64" }), cache) end)
      local k = cache[1].k
      local heads = k:size(3)   -- (B, T, kv heads of this rank, hd), see loom.models.blocks.attend
      local all = name == "hf_gpt2" and one.config.n_head or one.config.n_kv_heads
      if k.dist ~= nil or heads ~= all / mesh:size() then bad[#bad + 1] = "cache holds " .. heads .. " heads" end
      assert.same({}, bad)
    end)
  end)
end

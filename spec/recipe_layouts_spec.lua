-- recipe_layouts_spec.lua: a second family through the same layout code.
-- examples/train.lua --model gpt2 (GPT-2: learned positions, LayerNorms
-- with biases, its head tied to the embedding) lays itself out through its
-- recipe (loom.models.recipe) and logs the same loss at every step as one
-- process (relative 1e-5, f32) at TP=2 with sequence parallelism, async
-- TP, PP=2 (the tied weight on both stages, its gradient summed between
-- them), CP=2 (the position ids cut like the sequence), FSDP=2 and
-- PP=2 x TP=2 + SP; a PP=2 checkpoint of the tied model resumes at one
-- process on the uninterrupted run's losses. And the recipe itself: what
-- it names of each family.
local sys = require("support.sys")
local loom = require("loom")

local flags = "--model gpt2 --steps 6 --dim 32 --layers 3 --heads 4 --seq 16 --batch 8 --eval-every 3 --sample 0 "
              .. "--quiet --run-dir none"

describe("a family's recipe", function()
  it("names the plan, FSDP units, pipeline parts, ties and CP buffers of Llama and GPT-2", function()
    local llama = loom.models.transformer.new { vocab_size = 16, dim = 16, n_layers = 2, n_heads = 2, max_seq_len = 8,
                                                tie_embeddings = true }
    local gpt2 = loom.models.gpt2.new { vocab_size = 16, n_positions = 8, n_embd = 16, n_layer = 2, n_head = 2 }
    local r1, r2 = loom.models.recipe(llama), loom.models.recipe(gpt2)
    assert.equal("llama", r1.name)
    assert.equal("gpt2", r2.name)
    assert.equal(2, #r1.fsdp_units(llama))
    assert.equal(gpt2.h:at(2), r2.fsdp_units(gpt2)[2])
    local parts = r2.pipeline_parts(gpt2).parts
    local fqns = {}
    for i, p in ipairs(parts) do fqns[i] = p[1] .. ":" .. p[3] end
    assert.same({ "wte:first", "wpe:first", "h.1:layer", "h.2:layer", "ln_f:last", "lm_head:last" }, fqns)
    assert.same({ { "output.weight", "tok_embeddings.weight" } }, r1.tied(llama))
    local bufs, dims = r2.cp_buffers(gpt2)
    assert.equal("pos_ids", bufs[1][2])
    assert.same({ 1 }, dims)
    assert.equal(16, r2.hidden_size(gpt2))
    local plan = r2.tp_plan(gpt2, { sequence_parallel = true, async_tp = true, tp = 2 })
    assert.equal("AsyncTPInput", plan["h.*.attn"].__name)
    assert.equal("PrepareModuleOutput", plan["wpe"].__name)
    assert.has_error(function() loom.models.recipe({}) end)
  end)
end)

describe("GPT-2 through train.lua", function()
  it("logs the same losses as one process at TP=2 + SP, async TP, PP=2, CP=2, FSDP=2 and PP=2 x TP=2 + SP", function()
    sys.matches_one_process(flags, 6, { { 2, "--tp 2 --sequence-parallel" },
                                        { 2, "--tp 2 --sequence-parallel --async-tp" },
                                        { 2, "--pp 2" }, { 2, "--cp 2" }, { 2, "--dp 2 --tp 1 --fsdp" },
                                        { 4, "--pp 2 --tp 2 --sequence-parallel" } })
  end)

  it("--pp 2 --save of the tied model, then --resume at one process, continues on the uninterrupted run's losses", function()
    local dir = sys.tmpdir()
    local ref = sys.train(2, flags .. " --pp 2", dir .. "/ref.json")
    sys.train(2, flags .. " --pp 2 --stop-after 3 --save " .. dir .. "/ck", dir .. "/first.json")
    local one = sys.train(1, flags .. " --resume " .. dir .. "/ck", dir .. "/one.json")
    assert.is_nil(one[3])
    for step = 4, 6 do
      local rel = math.abs(one[step] - ref[step]) / math.abs(ref[step])
      assert(rel <= 1e-5, string.format("step %d: %.9g vs %.9g (rel %.2e)", step, one[step], ref[step], rel))
    end
    sys.rmtree(dir)
  end)
end)

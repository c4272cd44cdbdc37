-- hf_families_train_spec.lua: examples/train.lua --init-from each family's
-- checkpoint (spec/fixtures/families: Llama 3, Qwen2, Qwen3, Mistral,
-- Phi-3, Gemma, OLMo 2; the model kind from its config.json) fine-tunes it
-- and logs the same loss at every step as one process (relative 1e-5, f32)
-- at PP=2 x CP=2 (tied embeddings on both stages, sliding windows cut
-- with the load-balanced sequence) and at TP=2 + SP x FSDP=2.
local sys = require("support.sys")

local FIX = "spec/fixtures/families/"

describe("train.lua --init-from a model family", function()
  for _, name in ipairs { "llama3", "qwen2", "qwen3", "mistral", "phi3", "gemma", "olmo2" } do
    it(name .. " fine-tunes alike in one process, at PP=2 x CP=2 and at TP=2 + SP x FSDP=2", function()
      sys.matches_one_process("--init-from " .. FIX .. name .. " --steps 4 --seq 16 --batch 8 --lr 1e-2 --warmup 0 "
                              .. "--eval-every 100 --eval-iters 1 --sample 0 --quiet --run-dir none", 4,
                              { { 4, "--pp 2 --cp 2" }, { 4, "--tp 2 --dp 2 --fsdp --sequence-parallel" } })
    end)
  end
  -- mixtures of experts with the router's loss (each TP rank routes every token)
  for _, name in ipairs { "mixtral", "qwen3_moe" } do
    it(name .. " fine-tunes alike in one process and at TP=2 + SP", function()
      sys.matches_one_process("--init-from " .. FIX .. name .. " --steps 4 --seq 16 --batch 8 --lr 1e-2 --warmup 0 "
                              .. "--eval-every 100 --eval-iters 1 --sample 0 --quiet --run-dir none", 4,
                              { { 2, "--tp 2 --sequence-parallel" } })
    end)
  end
end)

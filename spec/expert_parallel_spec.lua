-- expert_parallel_spec.lua: expert parallelism (train.lua --ep) through
-- train.lua: a mixture of experts in every layer (--experts 4 --top-k 2),
-- its experts sharded over ep data-parallel ranks and the tokens carried
-- to them by all-to-all (loom.parallel.expert), logs the same loss and
-- gradient norm at every step as one process (relative 1e-5, f32) at EP=2,
-- EP=2 x TP=2 + SP, EP=2 x DP=2, EP=2 x FSDP=2 (the experts FSDP-sharded
-- over dp x cp), EP=2 x CP=2 (with FSDP too) and EP=2 x PP=2; with the
-- experts' hidden dim cut over tp (--etp) at TP=2, EP=2 x TP=2 + SP x
-- FSDP and EP=2 x DP=2 x TP=2 with FSDP (8 ranks: the (ep, tp) experts
-- sharded over dp too); a Qwen3-MoE checkpoint fine-tuned with --init-from at --ep 2
-- matches one process (its router loss off: each rank's would be of its
-- own tokens); and the memory each layout predicts is what rank 0 holds.
local sys = require("support.sys")

describe("expert parallelism through train.lua", function()
  it("--experts 4 logs one process's losses at EP=2, EP=2 x TP=2 + SP, EP=2 x DP=2, EP=2 x CP=2, EP=2 x PP=2", function()
    sys.matches_one_process("--experts 4 --top-k 2 --steps 5 --dim 32 --layers 2 --heads 4 --seq 16 --batch 8 --lr 1e-2 "
                            .. "--warmup 0 --eval-every 100 --eval-iters 1 --sample 0 --quiet --run-dir none", 5,
                            { { 2, "--ep 2 --tp 1" }, { 4, "--ep 2 --tp 2 --sequence-parallel" },
                              { 4, "--ep 2 --dp 2 --tp 1" }, { 4, "--ep 2 --dp 2 --tp 1 --fsdp" },
                              { 4, "--ep 2 --cp 2 --tp 1" }, { 4, "--ep 2 --cp 2 --tp 1 --fsdp" },
                              { 4, "--ep 2 --pp 2 --tp 1" }, { 2, "--tp 2 --etp 2" },
                              { 4, "--ep 2 --tp 2 --etp 2 --sequence-parallel --fsdp" },
                              { 8, "--ep 2 --dp 2 --tp 2 --etp 2 --fsdp" } })
  end)

  it("predicts the parameters rank 0 holds at each expert layout (EP, ETP, FSDP over dp x ep x cp)", function()
    local flags = "--experts 4 --top-k 2 --steps 1 --dim 32 --layers 2 --heads 4 --seq 16 --batch 8 --eval-every 100 "
                  .. "--eval-iters 1 --sample 0 --quiet --run-dir none"
    for _, l in ipairs { { 2, "--tp 2 --etp 2" }, { 4, "--ep 2 --tp 2 --etp 2 --fsdp" },
                         { 4, "--ep 2 --dp 2 --tp 1 --fsdp" }, { 4, "--ep 2 --cp 2 --tp 1 --fsdp" } } do
      local rc, out = sys.sh_clean(string.format("scripts/loomrun -n %d examples/train.lua %s %s", l[1], flags, l[2]))
      assert.equal(0, rc, out)
      local got, want = out:match("measured on rank 0: parameters ([%d.]+) MB %(predicted ([%d.]+)%)")
      assert.is_not_nil(got, out)
      assert.equal(want, got, l[2])
    end
  end)

  it("--init-from a Qwen3-MoE checkpoint at --ep 2 and at --tp 2 --etp 2 logs one process's losses", function()
    sys.matches_one_process("--init-from spec/fixtures/families/qwen3_moe --aux-loss-coef 0 --steps 4 --seq 16 --batch 8 "
                            .. "--lr 1e-2 --warmup 0 --eval-every 100 --eval-iters 1 --sample 0 --quiet --run-dir none", 4,
                            { { 2, "--ep 2 --tp 1" }, { 2, "--tp 2 --etp 2" } })
  end)

  it("--ep or --etp without a mixture of experts, and --etp other than 1 or --tp, is one line", function()
    local rc, out = sys.sh_clean("scripts/loomrun -n 2 examples/train.lua --ep 2 --tp 1 --steps 1 --run-dir none")
    assert.equal(2, rc, out)
    assert.matches("--ep shards a mixture of experts' experts, and this model has none", out, 1, true)
    rc, out = sys.sh_clean("scripts/loomrun -n 2 examples/train.lua --etp 2 --tp 2 --steps 1 --run-dir none")
    assert.equal(2, rc, out)
    assert.matches("--etp shards a mixture of experts' experts, and this model has none", out, 1, true)
    rc, out = sys.sh_clean("scripts/loomrun -n 2 examples/train.lua --experts 4 --etp 2 --tp 1 --dp 2 --steps 1 --run-dir none")
    assert.equal(2, rc, out)
    assert.matches("--etp 2 must be 1 (the experts whole on each tp rank) or the --tp degree, 1", out, 1, true)
  end)
end)

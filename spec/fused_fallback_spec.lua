-- fused_fallback_spec.lua: the fused-kernel specs once more in a child
-- process with LOOM_CPU_FUSED=0, where the CPU backend registers without
-- its fused kernels: every op then runs its composed form, which must pass
-- the same checks against the same references (and each one-pass check
-- turns into "the composed ops ran"), as a backend without the slots would.
local sys = require("support.sys")

local root = sys.root

describe("the composed forms (LOOM_CPU_FUSED=0)", function()
  it("pass the fused specs", function()
    local specs = {}
    for _, name in ipairs { "pointwise", "rows", "attention", "loss", "optim" } do
      specs[#specs + 1] = "spec/fused_" .. name .. "_spec.lua"
    end
    specs[#specs + 1] = "spec/hardtanh_spec.lua" -- clamp's gradient at its bounds
    local rc, out = sys.sh("cd " .. sys.shq(root) .. " && LOOM_CPU_FUSED=0 luajit scripts/run_specs.lua -o plainTerminal "
                           .. table.concat(specs, " "))
    local ok = out:match("(%d+) successes / 0 failures / 0 errors")
    assert(rc == 0 and ok and tonumber(ok) > 0, "LOOM_CPU_FUSED=0 run failed:\n" .. out)
  end)
end)

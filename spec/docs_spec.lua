-- docs_spec.lua: the docs run as written. Every ```lua block of README.md
-- and docs/*.md runs; consecutive blocks of a page with the same marker
-- run as one script, in order, so they share their names. Markers, on the
-- line before a block:
--   <!-- doc: ranks=4 -->    runs under scripts/loomrun -n 4
--   <!-- doc: fragment -->   not run (a piece of a bigger program)
--   <!-- doc: ranks=2 script -->  a whole script: runs alone, not joined
-- Blocks run in a scratch directory that sees the checkout's spec/ and
-- examples/ (paths as from the root, where the docs say to run them).
-- A block also runs pasted into the REPL when it is the guide's tour.
local sys = require("support.sys")

local root = io.popen("cd " .. sys.root .. " && pwd"):read("*l") .. "/"   -- blocks run in a scratch directory

local function pages()
  local list = { "README.md" }
  local p = io.popen("ls " .. root .. "docs/*.md")
  for f in p:lines() do list[#list + 1] = f:sub(#root + 1) end
  p:close()
  return list
end

-- blocks(text): {code, line, ranks, fragment} for each ```lua block
local function blocks(text)
  local out, marker, n, inside = {}, nil, 0, nil
  for line in (text .. "\n"):gmatch("(.-)\n") do
    n = n + 1
    if inside then
      if line:match("^```%s*$") then
        out[#out + 1] = inside
        inside = nil
      else
        inside.code = inside.code .. line .. "\n"
      end
    elseif line:match("^```lua%s*$") then
      local m = marker or ""
      inside = { code = "", line = n, ranks = tonumber(m:match("ranks=(%d+)")) or 1,
                 fragment = m:find("fragment", 1, true) ~= nil, alone = m:find("script", 1, true) ~= nil }
      marker = nil
    else
      local m = line:match("^<!%-%- doc: (.-) %-%->%s*$")
      if m then marker = m elseif line:match("%S") then marker = nil end
    end
  end
  return out
end

-- runs(page): the scripts of a page: each run of consecutive blocks with
-- the same ranks (fragments left out) as one script
local function runs(page)
  local list = {}
  for _, b in ipairs(blocks(sys.read(root .. page))) do
    if not b.fragment then
      local last = list[#list]
      if last and last.ranks == b.ranks and not (b.alone or last.alone) then
        last.code = last.code .. b.code
      else
        list[#list + 1] = { ranks = b.ranks, line = b.line, code = b.code, alone = b.alone }
      end
    end
  end
  return list
end

describe("the docs' Lua blocks", function()
  local function run(page, r)
    local dir = sys.tmpdir()
    for _, d in ipairs { "spec", "examples" } do sys.sh("ln -s " .. root .. d .. " " .. dir .. "/" .. d) end
    local script = dir .. "/block.lua"
    sys.write(script, 'package.path = "' .. root .. 'lua/?.lua;' .. root .. 'lua/?/init.lua;" .. package.path\n'
                      .. r.code)
    local cmd = r.ranks > 1
      and ("cd " .. dir .. " && " .. root .. "scripts/loomrun -n " .. r.ranks .. " --timeout 120 --quiet-others " .. script)
      or ("cd " .. dir .. " && luajit " .. script)
    local rc, out = sys.sh(cmd)
    sys.rmtree(dir)
    return rc, out
  end

  for _, page in ipairs(pages()) do
    for _, r in ipairs(runs(page)) do
      it(page .. ":" .. r.line .. " runs (" .. r.ranks .. (r.ranks > 1 and " ranks)" or " rank)"), function()
        local rc, out = run(page, r)
        assert.equal(0, rc, page .. ":" .. r.line .. "\n" .. out)
      end)
    end
  end

  it("finds the blocks and their markers", function()
    local bs = blocks("x\n<!-- doc: ranks=4 -->\n```lua\na = 1\n```\ntext\n```lua\nb = 2\n```\n"
                      .. "<!-- doc: fragment -->\n\n```lua\nc\n```\n")
    assert.equal(3, #bs)
    assert.same({ 4, 1, 1 }, { bs[1].ranks, bs[2].ranks, bs[3].ranks })
    assert.same({ false, false, true }, { bs[1].fragment, bs[2].fragment, bs[3].fragment })
    assert.equal("a = 1\n", bs[1].code)
  end)
end)

describe("the guide's tour pasted into the REPL", function()
  it("runs in `loom` line by line and prints what the guide says", function()
    local tour = blocks(sys.read(root .. "docs/guide.md"))[1].code
    local rc, out = sys.sh_input(root .. "scripts/loom", tour)
    assert.equal(0, rc, out)
    assert.truthy(out:find("loom.Size{3, 4}\t3\tf32\tcpu", 1, true), out)
  end)

  it("its DTensor part runs in `loomrun -n 4 --repl`, printing sizes and the sharding once", function()
    local mesh_block = blocks(sys.read(root .. "docs/guide.md"))[2].code
    local rc, out = sys.sh_input(root .. "scripts/loomrun -n 4 --timeout 120 --repl", mesh_block)
    assert.equal(0, rc, out)
    assert.truthy(out:find("[ranks 0-3] loom.Size{8, 6}\tloom.Size{2, 6}", 1, true), out)
    local _, n = out:gsub("2%-D of size 8x6", "")
    assert.equal(1, n, out)   -- rank 0 prints it, once
    assert.truthy(out:find("[ranks 0-3] 1\n", 1, true), out)   -- one all_gather
  end)
end)

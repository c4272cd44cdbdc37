-- hostile_token_files_spec.lua: token files and text_to_bin.lua under
-- hostile input and misuse (issue 34's held-out cases), each ending in a
-- clear error or the right answer: a token file truncated while open is an
-- error naming it (a memory map died of SIGBUS), a FIFO and a directory
-- are refused by name (a FIFO hung), text_to_bin refuses --val outside
-- [0, 1), a tiny --chunk and a directory as --input in one line (they
-- exited 0 with empty files), cuts a text without line ends at character
-- boundaries (a --chunk that cut a UTF-8 character made a file it then
-- refused), and train.lua finds a validation split too short for one
-- sequence before training.
local loom = require("loom")
local sys = require("support.sys")

local TOK = "spec/fixtures/tokenizers/gpt2.json"

describe("token files", function()
  it("a file truncated while open is an error naming it, not a crash", function()
    local d = sys.tmpdir()
    sys.write(d .. "/t.bin", string.rep("\1\0", 1000))
    local tf = loom.data.TokenFile(d .. "/t.bin")
    assert.equal(2, tf:get(500))
    sys.write(d .. "/t.bin", string.rep("\1\0", 10))   -- shrunk under it
    local ok, err = pcall(tf.get, tf, 500)
    assert.is_false(ok)
    assert.matches("t.bin: the file ends early", tostring(err), 1, true)
    sys.rmtree(d)
  end)

  it("a FIFO and a directory are refused by name", function()
    local d = sys.tmpdir()
    os.execute("mkfifo " .. sys.shq(d .. "/fifo"))
    local ok, err = pcall(loom.data.TokenFile, d .. "/fifo")
    assert.is_false(ok)
    assert.matches("is a named pipe, not a regular file", tostring(err), 1, true)
    ok, err = pcall(loom.data.TokenFile, d)
    assert.is_false(ok)
    assert.matches("is a directory, not a regular file", tostring(err), 1, true)
    sys.rmtree(d)
  end)
end)

describe("text_to_bin.lua", function()
  local function t2b(args) return sys.sh_clean("luajit scripts/text_to_bin.lua --tokenizer " .. TOK .. " " .. args) end

  it("refuses --val outside [0, 1), a tiny --chunk and a directory as --input, in one line", function()
    local d = sys.tmpdir()
    sys.write(d .. "/in.txt", "hello world\n")
    for _, case in ipairs { { "--val 1", "--val expects a fraction in [0, 1), got 1" },
                            { "--val -0.5", "--val expects a fraction in [0, 1), got -0.5" },
                            { "--chunk 0", "--chunk expects an integer number of bytes >= 64, got 0" } } do
      local rc, out = t2b("--input " .. d .. "/in.txt --out " .. d .. "/o " .. case[1])
      assert.equal(2, rc, out)
      assert.equal("text_to_bin.lua: error: " .. case[2] .. "\n", out)
    end
    local rc, out = t2b("--input " .. d .. " --out " .. d .. "/o")
    assert.equal(2, rc, out)
    assert.matches("is a directory, not a regular file", out, 1, true)
    sys.rmtree(d)
  end)

  it("small chunks over multi-byte text without line ends keep every character: the ids decode to the text", function()
    local d = sys.tmpdir()
    local text = string.rep("héllo·wörld→", 300)   -- no line end, no space
    sys.write(d .. "/in.txt", text)
    local rc, out = t2b("--input " .. d .. "/in.txt --out " .. d .. "/o --chunk 64 --val 0")
    assert.equal(0, rc, out)
    local tok = loom.data.Tokenizer.from_file(TOK)
    local tf = loom.data.TokenFile(d .. "/o/train.bin")
    local ids = {}
    for i = 1, tf:numel() do ids[i] = tf:get(i) end
    assert.equal(text, tok:decode(ids))
    sys.rmtree(d)
  end)
end)

describe("train.lua's validation split", function()
  it("too short for one sequence is refused before training", function()
    local d = sys.tmpdir()
    sys.write(d .. "/tiny.txt", string.rep("abcdefgh\n", 20))
    local rc, out = sys.sh_clean("luajit examples/train.lua --data " .. d .. "/tiny.txt --seq 32 --steps 2 --run-dir none")
    assert.equal(2, rc, out)
    assert.matches("the validation split holds 18 tokens, too few for one sequence of --seq 32", out, 1, true)
    sys.rmtree(d)
  end)
end)

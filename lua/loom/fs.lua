-- fs.lua: the file work loom does (make, list, remove and rename paths)
-- through lua-filesystem, with no shell. Failures raise errors that name
-- the path and give the system's reason.
local lfs = require "lfs"

local M = {}

-- mode(path): "file", "directory", ... or nil when path does not exist
-- (symbolic links are not followed)
function M.mode(path)
  return lfs.symlinkattributes(path, "mode")
end
function M.exists(path) return M.mode(path) ~= nil end
function M.is_dir(path) return lfs.attributes(path, "mode") == "directory" end
function M.is_file(path) return lfs.attributes(path, "mode") == "file" end

-- mkdir_p(path): makes path and its missing parents, like mkdir -p
local function mkdir(path)
  if M.is_dir(path) then return end
  if M.exists(path) then error(path .. " exists and is not a directory", 0) end
  local parent = path:match("^(.*[^/])/+[^/]+/*$")
  if parent then mkdir(parent) end
  local ok, err = lfs.mkdir(path)
  if not ok and not M.is_dir(path) then error(path .. ": " .. tostring(err), 0) end   -- (or another rank made it)
end
function M.mkdir_p(path)
  local ok, err = pcall(mkdir, path)
  if not ok then error("cannot create the directory " .. path .. ": " .. tostring(err):gsub("^" .. path:gsub("%p", "%%%0") .. ": ", ""), 0) end
end

-- list(dir): the names in dir (without . and ..), sorted
function M.list(dir)
  local ok, iter, state = pcall(lfs.dir, dir)
  if not ok then error("cannot list the directory " .. dir .. ": " .. tostring(iter):gsub("^.-: ", ""), 0) end
  local names = {}
  for name in iter, state do
    if name ~= "." and name ~= ".." then names[#names + 1] = name end
  end
  table.sort(names)
  return names
end

-- rm_rf(path): removes path and everything under it, like rm -rf; a
-- missing path is not an error. Links are removed, not followed.
function M.rm_rf(path)
  local mode = M.mode(path)
  if mode == nil then return end
  if mode == "directory" then
    for _, name in ipairs(M.list(path)) do M.rm_rf(path .. "/" .. name) end
    local ok, err = lfs.rmdir(path)
    if not ok then error("cannot remove the directory " .. path .. ": " .. tostring(err), 0) end
  else
    local ok, err = os.remove(path)
    if not ok then error("cannot remove " .. tostring(err), 0) end   -- err starts with the path
  end
end

-- rename(from, to): os.rename with an error that names both paths
function M.rename(from, to)
  local ok, err = os.rename(from, to)
  if not ok then error("cannot rename " .. from .. " to " .. to .. ": " .. tostring(err):gsub("^.-: ", ""), 0) end
end

return M

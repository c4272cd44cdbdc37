-- loom.models: the model families (each a model file with its recipe:
-- loom.models.recipe), and Hugging Face checkpoints (hf) for them.
local M = { transformer = require("loom.models.transformer"), gpt2 = require("loom.models.gpt2"),
            hf = require("loom.models.hf") }

-- the families by name, as config.json's model_type and train.lua's --model say them
M.families = { llama = M.transformer, gpt2 = M.gpt2 }

-- family(name) -> the family's module (new, config, tp_plan, recipe)
function M.family(name)
  local f = M.families[name]
  if not f then
    local names = {}
    for k in pairs(M.families) do names[#names + 1] = k end
    table.sort(names)
    require("loom.tensor").argerror("models.family", "name", "one of " .. table.concat(names, ", "), tostring(name), 2)
  end
  return f
end

-- recipe(model) -> the recipe of model's family (loom.models.recipe)
M.recipe = require("loom.models.recipe").of

return M

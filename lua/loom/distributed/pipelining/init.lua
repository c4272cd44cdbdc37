-- loom.distributed.pipelining: pipeline parallelism with PyTorch's names
-- (torch.distributed.pipelining). Cut a model into stages (pipeline() at
-- layer FQNs, or any module of your own per stage), wrap each in a
-- PipelineStage on its rank of the "pp" mesh dim, and step a schedule:
--   local pp = require("loom.distributed.pipelining")
--   local pipe = pp.pipeline(model, {split_spec = {["layers.3"] = pp.SplitPoint.BEGINNING}})
--   local stage = pipe:build_stage(mesh:get_local_rank("pp"), {group = mesh, mesh_dim = "pp"})
--   local sched = pp.Schedule1F1B(stage, 4, function(out, y) return F.cross_entropy(...) end)
--   sched:step(x, {target = y, losses = losses})   -- x used on stage 0, target on the last
local schedules = require("loom.distributed.pipelining.schedules")
local split = require("loom.distributed.pipelining.split")
local Stage = require("loom.distributed.pipelining.stage")

-- every schedule and action list of schedules.lua, under its own name
local M = { PipelineStage = Stage.new, pipeline = split.pipeline, SplitPoint = split.SplitPoint }
for name, fn in pairs(schedules) do M[name] = fn end
return M

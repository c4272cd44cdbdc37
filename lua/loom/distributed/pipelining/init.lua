-- loom.distributed.pipelining: pipeline parallelism with PyTorch's names
-- (torch.distributed.pipelining). Cut a model into stages (pipeline() at
-- layer FQNs, or any module of your own per stage), wrap each in a
-- PipelineStage on its rank of the "pp" mesh dim, and step a schedule:
--   local pp = require "loom.distributed.pipelining"
--   local pipe = pp.pipeline(model, {split_spec = {["layers.3"] = pp.SplitPoint.BEGINNING}})
--   local stage = pipe:build_stage(mesh:get_local_rank("pp"), {group = mesh, mesh_dim = "pp"})
--   local sched = pp.Schedule1F1B(stage, 4, function(out, y) return F.cross_entropy(...) end)
--   sched:step(x, {target = y, losses = losses})   -- x used on stage 0, target on the last
local schedules = require "loom.distributed.pipelining.schedules"
local split = require "loom.distributed.pipelining.split"
local Stage = require "loom.distributed.pipelining.stage"

return {
  PipelineStage = Stage.new,
  ScheduleGPipe = schedules.ScheduleGPipe,
  Schedule1F1B = schedules.Schedule1F1B,
  ScheduleInterleaved1F1B = schedules.ScheduleInterleaved1F1B,
  ScheduleLoopedBFS = schedules.ScheduleLoopedBFS,
  interleaved_actions = schedules.interleaved_actions,
  bubble_fraction = schedules.bubble_fraction,
  gpipe_actions = schedules.gpipe_actions,
  one_f_one_b_actions = schedules.one_f_one_b_actions,
  pipeline = split.pipeline,
  SplitPoint = split.SplitPoint,
}

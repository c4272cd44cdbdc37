-- loom.optim: optimizers and learning-rate schedules.
return {
  SGD = require("loom.optim.sgd"),
  AdamW = require("loom.optim.adamw"),
  lr_scheduler = require("loom.optim.lr_scheduler"),
}

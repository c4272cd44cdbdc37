-- loom.models: reference models.
return { transformer = require "loom.models.transformer" }

-- loom.models: reference models, and Hugging Face checkpoints (hf) for them.
return { transformer = require("loom.models.transformer"), gpt2 = require("loom.models.gpt2"),
         hf = require("loom.models.hf") }

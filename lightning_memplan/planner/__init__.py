"""Planning a Lightning training step: settings (:mod:`.settings`), the step model (:mod:`.step_model`),
the plan search (:mod:`.search`) and activation checkpointing of chosen blocks (:mod:`.checkpointing`),
the decision (:mod:`.decision`), the chosen plan's forecast (:mod:`.plan_forecast`), the warnings
(:mod:`.messages`) and the one pipeline over them (:mod:`.pipeline`)."""

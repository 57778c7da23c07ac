"""Pure algorithms on plain data, importable without torch: the backward-pass simulator
(:mod:`.simulate`), whole-graph rematerialization (:mod:`.remat`) and the CUDA caching
allocator model (:mod:`.cuda_allocator`)."""

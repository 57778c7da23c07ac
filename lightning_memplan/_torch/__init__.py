"""Every private torch symbol the package uses, by concern: :mod:`.version`, :mod:`.dynamo`,
:mod:`.partitioner`, :mod:`.inductor`, :mod:`.inductor_wrapper`, :mod:`.fsdp`, :mod:`.storages`,
:mod:`.profiler`, :mod:`.optim`."""

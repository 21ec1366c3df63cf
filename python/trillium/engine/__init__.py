"""Engine: model runner (one step on the model), sampler. Knows nothing of HTTP."""

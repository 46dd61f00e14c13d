"""Text generation: the continuous batcher, backends, prompts, the generate task, INT4, vLLM."""

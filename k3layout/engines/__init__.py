"""Engine bridges: read an engine's own config and cache objects, plan from them and check
what the engine built against the plan (``k3layout.engines.vllm``). A bridge reads the
engine's objects by their attributes and never imports the engine."""

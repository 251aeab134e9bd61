"""The engines, one package each, each registering itself with :mod:`k3layout.registry`:

- :mod:`.vllm`: vLLM 0.33's hybrid allocator, its capacity, and the bridge that reads vLLM's
  own config and cache objects (and the startup plugin);
- :mod:`.tokenspeed`: tokenspeed's parent-block packing (``engine="tokenspeed"``);
- :mod:`.sglang`: SGLang 0.5.23's token pool and state pool, capacity, P/D and bridge.

A bridge reads the engine's objects by their attributes and never imports the engine. Each is
declared under the ``k3layout.engines`` entry points (``pyproject.toml``), which the registry
reads: a new engine is a package, here or in another distribution, that declares itself there.
"""
